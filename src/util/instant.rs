//! `Instant + Duration` that never panics. A duration a user sets may be
//! `Duration::MAX` (a wait "as long as it takes", a breaker open or a
//! block "for ever"), and a plain `+` on an instant panics past the clock's
//! range.

use std::time::Duration;

/// Far enough ahead that it never comes, near enough for every clock.
const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The instants the crate keeps: std's and Tokio's.
pub(crate) trait Instant: Copy {
    fn checked_add(&self, d: Duration) -> Option<Self>;
}

impl Instant for std::time::Instant {
    fn checked_add(&self, d: Duration) -> Option<Self> {
        std::time::Instant::checked_add(self, d)
    }
}

impl Instant for tokio::time::Instant {
    fn checked_add(&self, d: Duration) -> Option<Self> {
        tokio::time::Instant::checked_add(self, d)
    }
}

/// `t + d`, or a century on when that is past the clock's range (and `t`
/// itself if even that is).
pub(crate) fn after<I: Instant>(t: I, d: Duration) -> I {
    t.checked_add(d)
        .or_else(|| t.checked_add(CENTURY))
        .unwrap_or(t)
}

/// Microseconds since the epoch, from the system clock (read as UTC): what
/// calendar windows and snapshots count in.
pub(crate) fn unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturates_at_a_century() {
        let t = std::time::Instant::now();
        assert_eq!(after(t, Duration::from_secs(1)), t + Duration::from_secs(1));
        assert_eq!(after(t, Duration::MAX), t + CENTURY);
        let t = tokio::time::Instant::now();
        assert_eq!(after(t, Duration::ZERO), t);
        assert_eq!(after(t, Duration::MAX), t + CENTURY);
    }
}
