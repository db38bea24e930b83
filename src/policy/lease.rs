//! Leased quota: a global rule's units taken from Redis in blocks and
//! spent in the gateway.

use std::time::Duration;

use crate::error::BuildError;
use crate::{algorithm::Algorithm, quota::Quota};

/// How a global rule leases quota: see [`Rule::lease`](crate::Rule::lease).
///
/// A gateway takes a block of units from the shared bucket in one Redis
/// call and spends it locally, at local cost, for at most `ttl`. For GCRA
/// and the token bucket, what is left when a lease ends goes back to Redis,
/// less what has flowed into the bucket since the lease was taken (that
/// much is back already); a window lease's leftovers go back when it ends,
/// to its own window only (Redis drops them once that window has ended).
/// Block sizes follow the key's
/// observed rate on this gateway (enough for one `ttl`, at most
/// [`max_units`](Self::max_units)), and never exceed an even share of what
/// is left among the gateways holding leases on the key.
///
/// **No overshoot.** A unit may be spent up to `ttl` after Redis counted
/// it, so for GCRA and the token bucket Redis counts leases in a bucket
/// whose burst is smaller by the units that flow in during one `ttl`
/// (`ceil(limit × ttl / window)`). Over any interval `t`, the units
/// admitted across every gateway then stay within `burst + rate × t`, as
/// the exact rule's. For the window algorithms a lease ends with the window
/// its units were counted in, so each window admits at most its limit. The
/// price is under-admission: that smaller burst, and units a gateway
/// leased but did not spend before its lease ended; the repository's
/// [BENCHMARKS.md](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/BENCHMARKS.md) measures it.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::rule::LeasePolicy;
/// let lease = LeasePolicy::new(Duration::from_millis(200)).with_max_units(500);
/// assert_eq!((lease.ttl(), lease.max_units()), (Duration::from_millis(200), 500));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeasePolicy {
    pub(crate) ttl: Duration,
    pub(crate) max_units: u32,
}

impl LeasePolicy {
    /// Leases that last at most `ttl` (at least 1 ms, at most a minute: the
    /// layer's build checks), of any size.
    pub const fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            max_units: u32::MAX,
        }
    }

    /// The most units one lease holds.
    pub const fn with_max_units(mut self, units: u32) -> Self {
        self.max_units = units;
        self
    }

    /// How long a lease may be spent.
    pub const fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The most units one lease holds.
    pub const fn max_units(&self) -> u32 {
        self.max_units
    }

    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        BuildError::invalid_if(
            self.ttl < Duration::from_millis(1) || self.ttl > Duration::from_secs(60),
            "a lease's ttl must be between 1 ms and 60 s",
        )?;
        BuildError::invalid_if(self.max_units == 0, "a lease needs max_units of at least 1")
    }

    /// The units that flow into a smooth bucket during one `ttl`: what Redis
    /// holds back from the burst.
    pub(crate) fn held_back(&self, quota: &Quota) -> u64 {
        flow(quota, self.ttl)
    }

    /// The quota Redis counts leases in: `quota` with the burst held back
    /// for a smooth algorithm. `None` when leases cannot keep the bound
    /// (the burst is gone, or a calendar quota): the rule then decides
    /// exactly.
    pub(crate) fn counted(&self, quota: Quota, algorithm: Algorithm) -> Option<Quota> {
        if quota.period().is_some() {
            return None;
        }
        if !algorithm.has_burst() {
            return Some(quota);
        }
        let burst = u64::from(quota.burst()).checked_sub(self.held_back(&quota))?;
        let burst = u32::try_from(burst).ok().filter(|b| *b >= 1)?;
        Some(quota.with_burst(burst))
    }
}

/// The units that flow into `quota`'s bucket over `d`, rounded up.
pub(crate) fn flow(quota: &Quota, d: Duration) -> u64 {
    let window = quota.window().as_nanos().max(1);
    let units = (u128::from(quota.limit()) * d.as_nanos()).div_ceil(window);
    u64::try_from(units).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_buckets_hold_back_one_ttl_of_flow() {
        let lease = LeasePolicy::new(Duration::from_millis(100));
        let q = Quota::per_second(1000);
        assert_eq!(lease.held_back(&q), 100);
        assert_eq!(
            lease.counted(q, Algorithm::Gcra).map(|q| q.burst()),
            Some(900)
        );
        assert_eq!(
            lease.counted(q, Algorithm::FixedWindow),
            Some(q),
            "a window's lease ends with it"
        );
        // A tenth of a unit rounds up to one: never less held back.
        assert_eq!(lease.held_back(&Quota::per_second(1)), 1);
        assert_eq!(
            lease.counted(Quota::per_second(5), Algorithm::TokenBucket),
            Some(Quota::per_second(5).with_burst(4))
        );
        assert_eq!(
            lease.counted(Quota::per_second(1), Algorithm::Gcra),
            None,
            "no burst left"
        );
        assert_eq!(
            lease.counted(Quota::per_calendar_day(100), Algorithm::Gcra),
            None
        );
    }

    #[test]
    fn validation() {
        assert!(LeasePolicy::new(Duration::ZERO).validate().is_err());
        assert!(
            LeasePolicy::new(Duration::from_secs(61))
                .validate()
                .is_err()
        );
        let lease = LeasePolicy::new(Duration::from_millis(50));
        assert!(lease.with_max_units(0).validate().is_err());
        assert!(lease.validate().is_ok());
    }
}

/// A rule's settings that only a global rule reads: how it calls Redis.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GlobalOptions {
    pub(crate) lease: Option<LeasePolicy>,
    pub(crate) coalesce: bool,
}

impl Default for GlobalOptions {
    fn default() -> Self {
        Self {
            lease: None,
            coalesce: true,
        }
    }
}
