//! At most one thing per period: a warning that would repeat on every
//! request, or a sweep that a flood would run on every request.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets one caller through per `every`; the first call always passes.
#[derive(Debug, Default)]
pub(crate) struct Throttle(AtomicU64);

impl Throttle {
    /// A throttle whose first call passes, for a `static`.
    pub(crate) const fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    pub(crate) fn ready(&self, every: Duration) -> bool {
        // Monotonic microseconds since the first throttle was asked, plus one.
        static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);
        let now = BASE.elapsed().as_micros() as u64 + 1;
        let last = self.0.load(Ordering::Relaxed);
        // 0 means never.
        (last == 0 || now >= last.saturating_add(every.as_micros() as u64))
            && self
                .0
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_period() {
        let t = Throttle::default();
        assert!(t.ready(Duration::from_secs(60)), "the first call passes");
        assert!(!t.ready(Duration::from_secs(60)));
        assert!(t.ready(Duration::ZERO));
    }
}
