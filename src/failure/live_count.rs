//! The live gateway count that `LocalFallback` divides a quota by, as the
//! Redis backend last read it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::util::instant::after;

/// The count last read (0 until one is), and what the failure mode divides
/// by: a count that fell holds its old value for one TTL more, so a Redis
/// that restarted empty (the first gateway to announce again reads 1) or a
/// gateway that flaps does not hand every gateway a bigger share at once.
#[derive(Debug, Default)]
pub(crate) struct LiveCount {
    read: AtomicU32,
    /// The count before a fall, and until when it holds.
    held: Mutex<Option<(u32, Instant)>>,
}

impl LiveCount {
    /// The live gateways as last read.
    pub(crate) fn read(&self) -> Option<u32> {
        match self.read.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// What to divide by: the count read, or a higher one it fell from
    /// within the last TTL.
    pub(crate) fn get(&self) -> Option<u32> {
        let read = self.read()?;
        let held = *self.held.lock().unwrap_or_else(PoisonError::into_inner);
        Some(match held {
            Some((n, until)) if Instant::now() < until => read.max(n),
            _ => read,
        })
    }

    pub(crate) fn set(&self, n: u32, ttl: Duration) {
        let before = self.read.swap(n, Ordering::Relaxed);
        if n < before {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let peak = held
                .filter(|(_, until)| Instant::now() < *until)
                .map_or(before, |(m, _)| m.max(before));
            *held = Some((peak, after(Instant::now(), ttl)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fall_in_the_count_holds_for_a_ttl() {
        let ttl = Duration::from_secs(3);
        let c = LiveCount::default();
        assert_eq!(c.get(), None, "nothing read yet");
        c.set(3, ttl);
        assert_eq!(c.get(), Some(3));
        // Redis restarted empty: this gateway announces first.
        c.set(1, ttl);
        assert_eq!((c.read(), c.get()), (Some(1), Some(3)));
        tokio::time::advance(Duration::from_secs(1)).await;
        c.set(2, ttl);
        assert_eq!(c.get(), Some(3), "still within the first fall's TTL");
        tokio::time::advance(ttl).await;
        assert_eq!(c.get(), Some(2), "a TTL after the last fall");
        c.set(4, ttl);
        assert_eq!(c.get(), Some(4), "a rise counts at once");
    }
}
