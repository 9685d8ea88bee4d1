//! What one device buffer holds, and the check that a computation over a larger tensor did
//! not fail without a word.
//!
//! burn's GPU backends (cubecl 0.10, under wgpu and CUDA alike) allocate a tensor on the
//! device's own thread: a tensor larger than the device's largest buffer (cubecl's
//! `max_page_size`: on wgpu the adapter's `max_storage_buffer_binding_size`, 128 MiB on
//! lavapipe and at WebGPU's defaults; on CUDA a quarter of the device memory) fails there, the
//! failure is caught and logged, and the call that asked for the tensor returns as if it had
//! succeeded. Every kernel that reads or writes the missing buffer is then skipped, its output
//! left as whatever the memory pool held before, and the errors are only reported by the next
//! `Backend::sync`. A generic `B: Backend` cannot ask the device for its limit (burn 0.21's
//! `Backend` exposes no device properties), so the models follow one rule: after a
//! computation in which some tensor exceeds [`DEVICE_BUFFER_BYTES`] (what every backend
//! holds), they synchronise the device and turn a reported failure into
//! [`ModelError::TooLargeForDevice`]. On the host backends, and on GPUs whose buffers are
//! large enough, the synchronisation succeeds and the values are returned.
//!
//! Weights are another matter: burn allocates a parameter it initialises in cubecl's
//! persistent pool, which has no size limit, so a vocabulary table over the limit exists, and
//! wgpu's validation panics on the device's thread when a kernel binds it ("Buffer binding 0
//! range ... exceeds `max_*_buffer_binding_size`"): loud, not wrong. The tables are in the
//! check all the same, for a table whose allocation failed (untested).

use burn::tensor::{backend::Backend, Tensor};

use crate::ModelError;

/// The largest tensor, in bytes, that every device xfmr runs on holds in one buffer: 128 MiB,
/// WebGPU's default `max_storage_buffer_binding_size`, which is all some adapters allow
/// (lavapipe, Mesa's CPU Vulkan driver, among them). A model synchronises the device after any
/// computation with a larger tensor, and returns [`ModelError::TooLargeForDevice`] if the
/// device could not hold it (see the module documentation of `device.rs`).
pub const DEVICE_BUFFER_BYTES: usize = 128 << 20;

/// A tensor's role, shape and size in bytes, and what to do when the device cannot hold it.
#[derive(Debug, Clone)]
pub(crate) struct Extent {
    what: &'static str,
    shape: Vec<usize>,
    bytes: usize,
    remedy: &'static str,
}

impl Extent {
    /// `shape` of elements of `elem_bytes` bytes each.
    pub(crate) fn new(
        what: &'static str,
        shape: Vec<usize>,
        elem_bytes: usize,
        remedy: &'static str,
    ) -> Self {
        let bytes = shape.iter().product::<usize>() * elem_bytes;
        Self {
            what,
            shape,
            bytes,
            remedy,
        }
    }

    /// Logits (or log-probabilities) `t`: computed for fewer positions at a time, they fit.
    pub(crate) fn logits<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Self {
        Self::new("logits", t.dims().to_vec(), t.dtype().size(), FEWER_ROWS)
    }

    /// A weight `t` (a vocabulary table): only a device with larger buffers holds it.
    pub(crate) fn weight<B: Backend, const D: usize>(what: &'static str, t: &Tensor<B, D>) -> Self {
        Self::new(what, t.dims().to_vec(), t.dtype().size(), LARGER_DEVICE)
    }

    /// Whether it exceeds [`DEVICE_BUFFER_BYTES`].
    pub(crate) fn exceeds_every_device(&self) -> bool {
        self.bytes > DEVICE_BUFFER_BYTES
    }

    /// [`ModelError::TooLargeForDevice`] for this tensor, with the device's report (or why
    /// the computation was not attempted).
    pub(crate) fn error(self, reported: String) -> ModelError {
        ModelError::TooLargeForDevice {
            what: self.what,
            shape: self.shape,
            bytes: self.bytes,
            limit: DEVICE_BUFFER_BYTES,
            remedy: self.remedy,
            reported,
        }
    }
}

/// `Ok` unless one of `extents` exceeds [`DEVICE_BUFFER_BYTES`] and the device, synchronised
/// (its queued work run), reports a failure: then the largest of them, named in a
/// [`ModelError::TooLargeForDevice`]. Nothing is synchronised when every extent is within the
/// limit.
pub(crate) fn check_fits<B: Backend>(
    device: &B::Device,
    extents: impl IntoIterator<Item = Extent>,
) -> Result<(), ModelError> {
    let Some(largest) = extents
        .into_iter()
        .filter(Extent::exceeds_every_device)
        .max_by_key(|e| e.bytes)
    else {
        return Ok(());
    };
    B::sync(device).map_err(|e| largest.error(e.to_string()))
}

/// What to do about logits too large for the device.
pub(crate) const FEWER_ROWS: &str = "compute the logits of fewer positions at a time: a smaller \
     batch, or for a decoder-only model `DecoderOnly::forward_chunks`, `last_logits` or \
     `token_log_probs`";

/// What to do about a weight too large for the device.
const LARGER_DEVICE: &str =
    "run the model on a device with larger buffers (a discrete GPU, or a CPU backend)";
