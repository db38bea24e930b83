//! Redis key layout: `prefix:{rule:key}:algo`, and `prefix:{limit:key}:lease`
//! for concurrency leases.
//!
//! Everything a script touches shares the `{rule:key}` hash tag, so it lands
//! in one cluster slot; the sliding window's per-window suffix comes after the
//! closing brace. The algorithm suffix keeps state of different shapes apart
//! when a rule changes algorithm during a rolling deploy (no WRONGTYPE).

use crate::{Algorithm, Key};

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
        Algorithm::TokenBucket => b"tb",
        Algorithm::FixedWindow => b"fw",
        Algorithm::SlidingWindow => b"sw",
    }
}

/// The suffix of a concurrency limit's lease set: a sorted set, kept apart
/// from a rate rule's state when both share a name.
pub(crate) const LEASE: &[u8] = b"lease";

/// The key bytes for one rule and key. `key` is hashed first when longer than
/// `max_key_len`; its bytes need not be UTF-8. A `}` inside `key` ends the tag
/// early, which is harmless: every key of one call still shares the tag.
pub(crate) fn redis_key(
    prefix: &str,
    rule: &str,
    key: &Key,
    max_key_len: usize,
    algorithm: Algorithm,
) -> Vec<u8> {
    tagged_key(prefix, rule, key, max_key_len, suffix(algorithm))
}

/// `prefix:{name:key}:suffix`, the layout every script's key shares.
pub(crate) fn tagged_key(
    prefix: &str,
    rule: &str,
    key: &Key,
    max_key_len: usize,
    suffix: &[u8],
) -> Vec<u8> {
    let key = key.clone().bounded(max_key_len);
    let mut out = Vec::with_capacity(prefix.len() + rule.len() + key.len() + suffix.len() + 5);
    if !prefix.is_empty() {
        out.extend_from_slice(prefix.as_bytes());
        out.push(b':');
    }
    out.push(b'{');
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

    #[test]
    fn layout_keeps_the_tag_and_binary_keys() {
        let k = redis_key(
            "rl",
            "api",
            &Key::from(vec![0xff, 0, b'x']),
            128,
            Algorithm::Gcra,
        );
        assert_eq!(k, b"rl:{api:\xff\x00x}:gcra");
        let k = redis_key("", "api", &Key::from("a"), 128, Algorithm::SlidingWindow);
        assert_eq!(k, b"{api:a}:sw");
        let k = tagged_key("rl", "exports", &Key::from("acct"), 128, LEASE);
        assert_eq!(k, b"rl:{exports:acct}:lease");
    }

    #[test]
    fn long_keys_are_hashed() {
        let long = Key::from("x".repeat(500));
        let k = redis_key("rl", "r", &long, 128, Algorithm::TokenBucket);
        assert_eq!(k.len(), "rl:{r:".len() + 64 + "}:tb".len());
    }

    #[test]
    fn braces_are_rejected() {
        assert!(validate_name("prefix", "a{b").is_err());
        assert!(validate_name("rule", "a}").is_err());
        assert!(validate_name("rule", "api:v1").is_ok());
    }
}
