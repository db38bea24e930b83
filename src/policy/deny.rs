//! What a rule does on a deny, with a full key space, and with a key that
//! keeps being denied.

use crate::error::BuildError;

/// What a rule does with a request over its quota.
///
/// `Wait` suits internal callers and job workers that would rather be slowed
/// than refused (tower's own `RateLimit` only delays): a request whose unit
/// comes back within `max` waits for it, holding its connection, and goes
/// on; one that would wait longer, or finds `queue` requests of its key
/// already waiting, is refused as with `Refuse`. A waiter whose client goes
/// away is dropped with its future and frees its place at once. Waiters of
/// one key retry when their wait ends, so each is admitted at a slot the
/// algorithm frees, in no particular order; each retry of a global rule is
/// a Redis call (or a deny-cache hit).
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::OnDeny};
/// let jobs = Rule::new("jobs", KeyExtractor::header("x-worker"), Quota::per_second(50))
///     .on_deny(OnDeny::Wait { max: Duration::from_secs(2), queue: 100 });
/// # let _ = jobs;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnDeny {
    /// Answer 429 at once (the default).
    #[default]
    Refuse,
    /// Wait up to `max` for the unit, with at most `queue` requests of one
    /// key waiting; otherwise refuse.
    Wait {
        /// The longest a request may be held.
        max: std::time::Duration,
        /// Requests of one key that may wait at once.
        queue: u32,
    },
}

/// What a rule does with a new key when its key space is full and no
/// bucket can be forgotten without changing a decision.
///
/// ```
/// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::KeySpaceFull};
/// let per_key = Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
///     .max_keys(100_000)
///     .on_key_space_full(KeySpaceFull::Refuse);
/// # let _ = per_key;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum KeySpaceFull {
    /// Count the new key in one bucket shared by every key that found no
    /// room, with the rule's quota (the default): the flood is limited as
    /// one client, and new clients share its fate until places free up.
    #[default]
    Overflow,
    /// Refuse the request with 429, `Retry-After` one window, and
    /// `outcome="key_space_full"` in the metrics (counted besides the
    /// `deny` every refusal is).
    Refuse,
}

/// Locks out a key that keeps being denied, fail2ban style: after `after`
/// denies by the rule within `within`, the key is denied for `block_for`,
/// longer than its quota would hold it, with `Retry-After` the time left.
/// A locked key is counted as `outcome="locked"` in the metrics, and
/// logged once, when locked, as a warning with the key's fingerprint.
///
/// On a local rule a locked key costs no backend call. On a global rule
/// the denies and the lock live in Redis, so every gateway sees them; a
/// gateway answers from what it learned of a lock for a second, then asks
/// Redis again (one Redis call a second per locked key, so an unblock
/// elsewhere reaches it within a second), a learned lock holds to its end
/// while Redis cannot answer, and the rule's denies skip the deny cache so
/// each counts.
/// A deny of a key the key space had no place for never counts. A rule
/// with a lockout cannot also wait ([`OnDeny::Wait`]): the build refuses
/// it.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::rule::Lockout;
/// // Five denies within a minute lock the key for fifteen minutes.
/// let l = Lockout::new(5, Duration::from_secs(60), Duration::from_secs(15 * 60));
/// assert_eq!(l.after(), 5);
/// assert_eq!(l.block_for(), Duration::from_secs(900));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lockout {
    pub(crate) after: u32,
    pub(crate) within: std::time::Duration,
    pub(crate) block_for: std::time::Duration,
}

impl Lockout {
    /// `after` denies within `within` lock the key for `block_for`. All
    /// three must be positive: the layer's build checks.
    pub const fn new(
        after: u32,
        within: std::time::Duration,
        block_for: std::time::Duration,
    ) -> Self {
        Self {
            after,
            within,
            block_for,
        }
    }

    /// The denies that lock a key.
    pub const fn after(&self) -> u32 {
        self.after
    }

    /// The period the denies are counted over.
    pub const fn within(&self) -> std::time::Duration {
        self.within
    }

    /// How long a lock lasts.
    pub const fn block_for(&self) -> std::time::Duration {
        self.block_for
    }

    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        BuildError::invalid_if(
            self.after == 0 || self.within.is_zero() || self.block_for.is_zero(),
            "a lockout needs at least one deny, a positive period and a positive block",
        )
    }
}
