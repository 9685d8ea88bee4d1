//! [`Strided`]: the products' view of a matrix in a slice, any strides.

/// A read-only matrix in a slice: element `(i, j)` at `offset + i·row_stride + j·col_stride`
/// (a burn tensor's layout, transposed views included).
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    /// The elements' buffer.
    pub data: &'a [f32],
    /// Where element `(0, 0)` is.
    pub offset: usize,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements from one row to the next.
    pub row_stride: usize,
    /// Elements from one column to the next.
    pub col_stride: usize,
}

impl<'a> Strided<'a> {
    /// A row-major `[rows, cols]` matrix filling `data`.
    ///
    /// # Panics
    /// If `data.len() != rows · cols`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "Strided::row_major: not [rows, cols]"
        );
        Self {
            data,
            offset: 0,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// Panics unless every element is inside `data`.
    pub(super) fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last =
                self.offset + (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
            assert!(last < self.data.len(), "Strided: element past the buffer");
        }
    }

    /// Element `(i, j)`.
    pub(crate) fn get(&self, i: usize, j: usize) -> f32 {
        self.data[self.offset + i * self.row_stride + j * self.col_stride]
    }

    /// Columns `j0..j0 + len` of row `i` as a slice, where its elements are adjacent (the
    /// flex glue's backward products read their rows through it).
    #[cfg_attr(not(feature = "flex"), allow(dead_code))]
    pub(crate) fn row_part(&self, i: usize, j0: usize, len: usize) -> Option<&'a [f32]> {
        let start = self.offset + i * self.row_stride + j0;
        (self.col_stride == 1).then(|| &self.data[start..start + len])
    }

    /// Row `i` as a slice, where its elements are adjacent.
    pub(super) fn row(&self, i: usize) -> Option<&'a [f32]> {
        let start = self.offset + i * self.row_stride;
        (self.col_stride == 1).then(|| &self.data[start..start + self.cols])
    }
}
