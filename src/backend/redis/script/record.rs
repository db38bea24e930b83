//! A rule's record of the quotas in play across the fleet (ADR 33): each
//! gateway enters the quota it counts a rolling rule in, and reads the
//! others'. A gateway started with new rules converts from the quotas
//! first seen before its own, as a reload would: a rolling restart hands
//! no key a fresh quota.

use std::time::Duration;

use super::sources::QUOTAS;
#[cfg(test)]
use crate::algorithm::Algorithm;
#[cfg(test)]
use crate::backend::redis::keys;
use crate::quota::Quota;

/// Another quota in a rule's record, on Redis time (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct InPlay {
    pub(crate) quota: Quota,
    /// When a gateway first counted under it.
    pub(crate) first_ms: i64,
    /// Until when a state under it may matter.
    pub(crate) until_ms: i64,
}

/// What `RedisBackend::quotas_in_play` read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    /// The other quotas of the rule's algorithm, as entered.
    pub(crate) others: Vec<InPlay>,
    /// When a gateway first counted under this one's quota.
    pub(crate) first_ms: i64,
    pub(crate) now_ms: i64,
}

/// The call entering `own` (a state key suffix) in the record `key` for
/// `lasts_ms`.
pub(crate) fn enter(key: Vec<u8>, own: &[u8], lasts_ms: u64) -> redis::ScriptInvocation<'static> {
    let mut invocation = QUOTAS.key(key);
    invocation.arg(own).arg(lasts_ms.min(1 << 50));
    invocation
}

/// The reply's triples, this gateway's last, then Redis time.
pub(crate) fn parse(flat: &[String], own: &[u8]) -> Option<Record> {
    let (now, triples) = flat.split_last()?;
    if triples.len() % 3 != 0 {
        return None;
    }
    let shape = own.split(|&b| b == b':').next()?;
    let mut others = Vec::new();
    let mut first_ms = None;
    for t in triples.chunks_exact(3) {
        let (first, until) = (t[1].parse().ok()?, t[2].parse().ok()?);
        if t[0].as_bytes() == own {
            first_ms = Some(first);
            continue;
        }
        // Another algorithm's states have another shape: not converted.
        if let Some((s, spec)) = t[0].split_once(':')
            && s.as_bytes() == shape
            && let Some(quota) = spec_quota(spec)
        {
            others.push(InPlay {
                quota,
                first_ms: first,
                until_ms: until,
            });
        }
    }
    Some(Record {
        others,
        first_ms: first_ms?,
        now_ms: now.parse().ok()?,
    })
}

/// `limit/window_us/burst` as the quota it names.
fn spec_quota(spec: &str) -> Option<Quota> {
    let mut it = spec.split('/').map(str::parse::<u64>);
    let (l, w, b) = (it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?);
    let (l, b) = (u32::try_from(l).ok()?, u32::try_from(b).ok()?);
    let quota = Quota::new(l, Duration::from_micros(w));
    // As a rule writes it: a burst of the limit is no burst.
    let quota = if b == l { quota } else { quota.with_burst(b) };
    quota.validate().ok().map(|()| quota)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_record_reads_the_same_shape_only() {
        let own = keys::state_suffix(Algorithm::Gcra, &Quota::per_minute(5));
        let reply = s(&[
            "gcra:10/60000000/10",
            "100",
            "900",
            "fw:10/60000000/10",
            "50",
            "900",
            "gcra:nonsense",
            "1",
            "2",
            std::str::from_utf8(&own).unwrap(),
            "200",
            "950",
            "300",
        ]);
        let r = parse(&reply, &own).unwrap();
        assert_eq!((r.first_ms, r.now_ms), (200, 300));
        assert_eq!(
            r.others,
            [InPlay {
                quota: Quota::per_minute(10),
                first_ms: 100,
                until_ms: 900
            }]
        );
        assert!(parse(&s(&["x", "1"]), &own).is_none(), "cut short");
    }
}
