//! A rule's keys: how many it holds, what a new one gets when they are
//! all taken, and whether a key's hash is shown ([`Rule::max_keys`],
//! [`Rule::on_key_space_full`], [`Rule::partition_key`]).

use super::{KeySpaceFull, Rule};

/// The most keys one rule holds in this process by default: about 100 MB
/// of local state at the ~100 bytes a key costs ([BENCHMARKS.md](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/BENCHMARKS.md), "Memory").
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// A rule's keys: the bound on each of its stores, what a new key gets at
/// the bound, and whether the `RateLimit` member carries the key's `pk`.
#[derive(Clone, Copy)]
pub(crate) struct KeySpace {
    pub(crate) max_keys: usize,
    pub(crate) on_key_space_full: KeySpaceFull,
    pub(crate) partition_key: bool,
}

impl Rule {
    /// The most keys this rule holds in this process (default
    /// [`DEFAULT_MAX_KEYS`], one million) in each of its stores: its local
    /// counters, and for a global rule its cached denies and, apart, its
    /// fallback shares and Redis's last answer per key (which the fallback
    /// starts from). Memory then
    /// stays under `max_keys` times the bytes a key costs (~100, see
    /// [BENCHMARKS.md](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/BENCHMARKS.md)), whatever a flood of distinct keys does.
    ///
    /// A new key that finds no place first makes room by forgetting full
    /// buckets (which changes no decision; at most ten sweeps a second
    /// while full); if none can go, [`on_key_space_full`](Self::on_key_space_full)
    /// applies. Keys already held keep their own limits throughout. Zero is
    /// a build error.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let per_ip = Rule::new("per-ip", KeyExtractor::peer_ip(), Quota::per_second(5)).max_keys(50_000);
    /// # let _ = per_ip;
    /// ```
    pub fn max_keys(mut self, n: usize) -> Self {
        self.key_space.max_keys = n;
        self
    }

    /// What a new key gets when the key space is full (default
    /// [`KeySpaceFull::Overflow`]): see [`max_keys`](Self::max_keys).
    pub fn on_key_space_full(mut self, policy: KeySpaceFull) -> Self {
        self.key_space.on_key_space_full = policy;
        self
    }

    /// Adds the draft's partition key `pk` to this rule's `RateLimit`
    /// member (default off): an sf-binary of the first 9 bytes of the
    /// SHA-256 of the key, so a client holding several keys can tell its
    /// quotas apart. The raw key is never sent; a low-entropy key (an IP
    /// address) can still be recovered by hashing every candidate, so turn it
    /// on for keys like API keys. `RateLimit-Policy` does not carry it: it
    /// stays the same for every key.
    ///
    /// ```
    /// # use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let per_key = Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
    ///     .partition_key(true);
    /// # let _ = per_key;
    /// ```
    pub fn partition_key(mut self, on: bool) -> Self {
        self.key_space.partition_key = on;
        self
    }
}
