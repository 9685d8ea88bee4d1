//! The bounds-checked cursor the GGUF parser reads through: every length is checked against
//! the bytes that remain before anything is allocated for it.

use super::*;

/// A bounds-checked little-endian cursor.
pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(super) fn take(
        &mut self,
        n: u64,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available: self.remaining() as u64,
            });
        }
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    pub(super) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(super) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(super) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let start = self.pos as u64;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| GgufError::Malformed {
            what: what(),
            offset: start,
            reason: format!("invalid UTF-8: {e}"),
        })
    }

    pub(super) fn value(&mut self, ty: u32, depth: usize, key: &str) -> Result<Value, GgufError> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            0 => Value::U64(self.array::<1>(&what)?[0] as u64),
            1 => Value::I64(self.array::<1>(&what)?[0] as i8 as i64),
            2 => Value::U64(u16::from_le_bytes(self.array(&what)?) as u64),
            3 => Value::I64(i16::from_le_bytes(self.array(&what)?) as i64),
            4 => Value::U64(self.u32(&what)? as u64),
            5 => Value::I64(i32::from_le_bytes(self.array(&what)?) as i64),
            6 => Value::F64(f32::from_le_bytes(self.array(&what)?) as f64),
            7 => Value::Bool(self.array::<1>(&what)?[0] != 0),
            8 => Value::String(self.string(&what)?),
            9 => {
                let start = self.pos as u64;
                let elem = self.u32(&what)?;
                let count = self.u64(&what)?;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.malformed(key, start, "arrays nested too deep"));
                }
                // Every element takes at least one byte (strings: eight), so a count larger
                // than the bytes left is a lie: refuse it before allocating anything.
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(self.malformed(
                            key,
                            start,
                            &format!("unknown array element type {other}"),
                        ))
                    }
                };
                if count.saturating_mul(min) > self.remaining() as u64 {
                    return Err(GgufError::Truncated {
                        what: format!("array {key:?} of {count} elements"),
                        offset: start,
                        needed: count.saturating_mul(min),
                        available: self.remaining() as u64,
                    });
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, depth + 1, key)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(&what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            other => {
                return Err(self.malformed(
                    key,
                    self.pos as u64 - 4,
                    &format!("unknown value type {other}"),
                ))
            }
        })
    }

    pub(super) fn malformed(&self, what: &str, offset: u64, reason: &str) -> GgufError {
        GgufError::Malformed {
            what: what.to_string(),
            offset,
            reason: reason.to_string(),
        }
    }
}
