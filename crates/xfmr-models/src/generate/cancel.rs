//! Stopping work whose result nobody will read: a client that went away, a deadline that
//! passed.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A cheap, cloneable "stop now" signal, checked by long loops between their batches and
/// decoding steps (generation, translation, sentence encoding).
///
/// Work is cancelled when [`cancel`](Self::cancel) was called on any clone, or when the
/// token's deadline passed. The loop that notices returns [`ModelError::Cancelled`](crate::ModelError::Cancelled)
/// (`crate::ModelError::Cancelled`) and frees what it holds; nothing is half-done in a way that
/// matters, since the caller discards the result.
///
/// ```
/// use std::time::{Duration, Instant};
/// use xfmr_models::generate::Cancel;
///
/// let token = Cancel::with_deadline(Instant::now() + Duration::from_secs(60));
/// let seen_by_worker = token.clone();
/// assert!(!seen_by_worker.is_cancelled());
/// token.cancel(); // the client disconnected
/// assert!(seen_by_worker.is_cancelled());
/// ```
#[derive(Clone, Default)]
pub struct Cancel {
    flag: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Cancel {
    /// A token with no deadline: cancelled only by [`cancel`](Self::cancel).
    pub fn new() -> Self {
        Self::default()
    }

    /// A token that is also cancelled once `deadline` has passed.
    pub fn with_deadline(deadline: Instant) -> Self {
        Self {
            flag: Arc::default(),
            deadline: Some(deadline),
        }
    }

    /// Cancels the work of every clone of this token.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
    }

    /// Whether the work should stop now.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// `Err(ModelError::Cancelled)` when the work should stop: `token.check()?` between steps.
    ///
    /// # Errors
    /// [`ModelError::Cancelled`](crate::ModelError::Cancelled).
    pub fn check(&self) -> Result<(), crate::ModelError> {
        match self.is_cancelled() {
            true => Err(crate::ModelError::Cancelled),
            false => Ok(()),
        }
    }

    /// A guard that cancels this token when dropped, unless [`CancelOnDrop::disarm`]ed: a
    /// request handler holds one so that a client that goes away (its future dropped)
    /// cancels the work queued for it.
    pub fn cancel_on_drop(&self) -> CancelOnDrop {
        CancelOnDrop(Some(self.clone()))
    }
}

/// Tokens are equal when they are clones of one another (the same signal).
impl PartialEq for Cancel {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.flag, &other.flag) && self.deadline == other.deadline
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Cancels its token when dropped ([`Cancel::cancel_on_drop`]).
#[derive(Debug)]
pub struct CancelOnDrop(Option<Cancel>);

impl CancelOnDrop {
    /// The work finished normally: dropping the guard no longer cancels it.
    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(token) = self.0.take() {
            token.cancel();
        }
    }
}
