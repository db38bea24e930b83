//! Redis key layout: `prefix:{<len>:rule:key}:algo:<limit>/<window_us>/<burst>`
//! for a rolling quota's state (`:cal` for calendar quotas, a hash whose
//! count is per key whatever the quota, beside the limit it was counted
//! under), `…}:lock` for a key's lock,
//! `prefix:{<len>:limit:key}:lease` for a concurrency limit's slots, and
//! `prefix:{9:instances:*}:live` for the live gateways (`membership.rs`),
//! where `<len>` is the name's length in bytes. Two more keys of a rule's
//! key are built by the Lua scripts alone, from the hash tag, so no Rust
//! function here names them: `…}:denies`, the denies counted toward a
//! lockout (beside `:lock`), and `…}:holders`, the gateways holding a
//! lease of its quota (a sorted set scored by lease end). `prefix:{<len>:rule:}:quotas`,
//! under the empty key, records the quotas a rule has in play across the
//! fleet (`quotas.lua`). After a reload moved a rolling
//! state, the old state key holds a tombstone: `>` and the quota that ends
//! the key it moved to (`quota_change.lua`).
//!
//! The length makes the layout injective: names may contain `:`, so without
//! it rule `api` with key `v2:x` and rule `api:v2` with key `x` would share
//! one counter. The prefix ends at the first `{` (prefixes have no braces),
//! the length fixes where the name ends, and the fixed suffix, none of which
//! ends another, where the key ends.
//!
//! Everything a script touches shares the `{...}` hash tag, so it lands in
//! one cluster slot; the sliding window's per-window suffix comes after the
//! closing brace. The algorithm suffix keeps state of different shapes apart
//! when a rule changes algorithm during a rolling deploy (no WRONGTYPE); it
//! changes with the state's shape too (`tb2`: one number, where `tb` was a
//! hash), so that gateways of two versions never read each other's state.

use crate::{algorithm::Algorithm, key::Key};

use super::RedisBackendError;

/// Rejects names that would let a brace into the hash tag.
pub(crate) fn validate_name(what: &'static str, name: &str) -> Result<(), RedisBackendError> {
    if name.contains(['{', '}']) {
        return Err(RedisBackendError::InvalidName {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

const fn suffix(algorithm: Algorithm) -> &'static [u8] {
    match algorithm {
        Algorithm::Gcra => b"gcra",
        Algorithm::TokenBucket => b"tb2",
        Algorithm::FixedWindow => b"fw",
        Algorithm::SlidingWindow => b"sw",
    }
}

/// The suffix of a calendar quota's count, whatever the rule's algorithm.
pub(crate) const CALENDAR: &[u8] = b"cal";

/// The suffix of a rule and key's lock (the control handle's block, a
/// lockout), whatever its algorithm: the scripts' `…}:lock`.
pub(crate) const LOCK: &[u8] = b"lock";

/// The suffix of a concurrency limit's slot set, a sorted set kept apart
/// from a rate rule's state when both share a name. `lease` is the name it
/// had before slots were called slots, kept so an upgrade shares counts.
pub(crate) const SLOTS: &[u8] = b"lease";

/// The key bytes for one rule and key under a rolling `quota`, already
/// bounded by the caller; its bytes need not be UTF-8. A `}` inside `key`
/// ends the tag early, which is harmless: every key of one call still
/// shares the tag. The suffix names the quota (`gcra:100/60000000/100`:
/// limit, window in µs, burst), so a state is never read under a quota it
/// was not written for: a reload converts it (`QuotaChange`), or a new
/// quota starts afresh.
pub(crate) fn redis_key(
    prefix: &str,
    rule: &str,
    key: &Key,
    algorithm: Algorithm,
    quota: &crate::quota::Quota,
) -> Vec<u8> {
    tagged_key(prefix, rule, key, &state_suffix(algorithm, quota))
}

/// What follows the hash tag in a rolling quota's state key
/// (`gcra:100/60000000/100`): the algorithm's shape, then the quota.
pub(crate) fn state_suffix(algorithm: Algorithm, quota: &crate::quota::Quota) -> Vec<u8> {
    let mut suffix = suffix(algorithm).to_vec();
    let mut n = itoa::Buffer::new();
    let window = u64::try_from(quota.window().as_micros()).unwrap_or(u64::MAX);
    for (sep, v) in [
        (b':', u64::from(quota.limit())),
        (b'/', window),
        (b'/', u64::from(quota.burst())),
    ] {
        suffix.push(sep);
        suffix.extend_from_slice(n.format(v).as_bytes());
    }
    suffix
}

/// The suffix of a rule's record of the quotas in play (`quotas.lua`),
/// under the empty key: `prefix:{<len>:rule:}:quotas`.
pub(crate) const QUOTAS: &[u8] = b"quotas";

/// `prefix:{<len>:name:key}:suffix`, the layout every script's key shares.
pub(crate) fn tagged_key(prefix: &str, rule: &str, key: &Key, suffix: &[u8]) -> Vec<u8> {
    let mut len = itoa::Buffer::new();
    let len = len.format(rule.len()).as_bytes();
    let mut out =
        Vec::with_capacity(prefix.len() + len.len() + rule.len() + key.len() + suffix.len() + 6);
    if !prefix.is_empty() {
        out.extend_from_slice(prefix.as_bytes());
        out.push(b':');
    }
    out.push(b'{');
    out.extend_from_slice(len);
    out.push(b':');
    out.extend_from_slice(rule.as_bytes());
    out.push(b':');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"}:");
    out.extend_from_slice(suffix);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const Q: crate::quota::Quota = crate::quota::Quota::per_minute(100);

    #[test]
    fn layout_keeps_the_tag_and_binary_keys() {
        let q = Q.with_burst(20);
        let k = redis_key(
            "rl",
            "api",
            &Key::from(vec![0xff, 0, b'x']),
            Algorithm::Gcra,
            &q,
        );
        assert_eq!(k, b"rl:{3:api:\xff\x00x}:gcra:100/60000000/20");
        let k = redis_key("", "api", &Key::from("a"), Algorithm::SlidingWindow, &Q);
        assert_eq!(k, b"{3:api:a}:sw:100/60000000/100");
        let k = tagged_key("rl", "exports", &Key::from("acct"), SLOTS);
        assert_eq!(k, b"rl:{7:exports:acct}:lease");
    }

    /// Every (rule, key, suffix) built from separators, braces and digits
    /// maps to its own Redis key.
    #[test]
    fn distinct_rules_and_keys_never_share_a_counter() {
        let parts = [
            "", ":", "::", "{", "}", "}:", ":{", "1", "1:", "3:", "api", "v2", "gcra", "}:gcra",
            "sw:1",
        ];
        let mut names = Vec::new();
        for a in parts {
            for b in parts {
                names.push(format!("{a}{b}"));
                names.push(format!("{a}:{b}"));
            }
        }
        names.sort();
        names.dedup();
        // No suffix holds a `}`: the last `}:` ends the key.
        let suffixes: Vec<&[u8]> = vec![
            b"gcra:1/2/3",
            b"gcra:1/2/34",
            b"gcra:12/3/4",
            b"tb2:1/2/3",
            b"fw:1/2/3",
            b"sw:1/2/3",
            SLOTS,
            CALENDAR,
            LOCK,
        ];
        let mut seen = HashMap::new();
        for rule in names
            .iter()
            .filter(|n| !n.is_empty() && validate_name("rule", n).is_ok())
        {
            for key in &names {
                for suffix in &suffixes {
                    let k = tagged_key("rl", rule, &Key::from(key.clone()), suffix);
                    if let Some(prev) = seen.insert(k.clone(), (rule.clone(), key.clone(), *suffix))
                    {
                        panic!(
                            "{prev:?} and {:?} share {:?}",
                            (rule, key, suffix),
                            String::from_utf8_lossy(&k)
                        );
                    }
                }
            }
        }
        assert!(seen.len() > 10_000, "{}", seen.len());
        // The reported collision: rule `api` with key `v2:victim`, rule `api:v2` with key `victim`.
        assert_ne!(
            redis_key("rl", "api", &Key::from("v2:victim"), Algorithm::Gcra, &Q),
            redis_key("rl", "api:v2", &Key::from("victim"), Algorithm::Gcra, &Q)
        );
    }

    /// The rate scripts take the lock key declared; the lease and control
    /// scripts build it from the state key (up to its last `}`): the same.
    #[test]
    fn the_declared_lock_is_the_one_the_scripts_build() {
        for key in ["a", "a}b", "}", "x:{y}", "}:gcra"] {
            let state = redis_key("rl", "api", &Key::from(key), Algorithm::Gcra, &Q);
            let tag_end = state.iter().rposition(|b| *b == b'}').unwrap();
            let mut built = state[..=tag_end].to_vec();
            built.extend_from_slice(b":lock");
            assert_eq!(
                tagged_key("rl", "api", &Key::from(key), LOCK),
                built,
                "{key}"
            );
        }
    }

    #[test]
    fn braces_are_rejected() {
        assert!(validate_name("prefix", "a{b").is_err());
        assert!(validate_name("rule", "a}").is_err());
        assert!(validate_name("rule", "api:v1").is_ok());
    }
}
