//! A descriptor's answer in Envoy's terms: its status, the units of its
//! limit, the response's headers, and its counter key.

use std::time::Duration;

use crate::pb::envoy::config::core::v3::HeaderValue as PbHeader;
use crate::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit,
};
use prost_types::Duration as PbDuration;

use super::config::{Limit, Node, TimeUnit};
use keyed_rate_limit::Key;
use keyed_rate_limit::decision::Decision;

pub(super) fn unit_of(pb: i32) -> TimeUnit {
    match pb {
        1 => TimeUnit::Second,
        2 => TimeUnit::Minute,
        3 => TimeUnit::Hour,
        4 => TimeUnit::Day,
        5 => TimeUnit::Month,
        6 => TimeUnit::Year,
        7 => TimeUnit::Week,
        _ => TimeUnit::Second,
    }
}

fn pb_unit(unit: TimeUnit) -> PbUnit {
    match unit {
        TimeUnit::Second => PbUnit::Second,
        TimeUnit::Minute => PbUnit::Minute,
        TimeUnit::Hour => PbUnit::Hour,
        TimeUnit::Day => PbUnit::Day,
        TimeUnit::Week => PbUnit::Week,
        TimeUnit::Month => PbUnit::Month,
        TimeUnit::Year => PbUnit::Year,
    }
}

pub(super) fn current(limit: &Limit) -> RateLimit {
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: limit.requests_per_unit,
        unit: pb_unit(limit.unit) as i32,
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A status with no numbers: `OK` or `OVER_LIMIT` alone, for what no
/// counter decided (a failure mode letting the request through: the
/// layer's headers leave such a rule out too).
pub(super) fn bare(code: Code) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        ..DescriptorStatus::default()
    }
}

/// A decision as a descriptor status; a shadow rule's refusal is `OK`.
pub(super) fn of(decision: Decision, shown: RateLimit, shadow: bool) -> DescriptorStatus {
    let over = !decision.is_allowed() && !shadow;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(shown),
        limit_remaining: decision.remaining(),
        duration_until_reset: Some(pb_duration(decision.reset())),
    }
}

/// The layer's headers as the response's `response_headers_to_add`.
pub(super) fn pb_headers<'a>(
    it: impl Iterator<Item = (&'a http::HeaderName, &'a http::HeaderValue)>,
) -> Vec<PbHeader> {
    it.filter_map(|(name, value)| {
        Some(PbHeader {
            key: name.as_str().to_owned(),
            value: value.to_str().ok()?.to_owned(),
            ..PbHeader::default()
        })
    })
    .collect()
}

/// A descriptor's counter key: each entry's key and value, each after its
/// length, so that no two descriptors share one (`a` = `x|b=y` is not `a`
/// = `x`, `b` = `y`). Whatever a client sends is counted: the layer hashes
/// a key past its `max_key_len` to a fixed size.
///
/// An entry matched by a `share_threshold` wildcard counts as its pattern:
/// every value it matches shares one counter.
pub(super) fn counter_key(entries: &[Entry], path: &[&Node]) -> Key {
    let len: usize = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 8)
        .sum();
    let mut out = String::with_capacity(len);
    // itoa, not `write!`: formatting was a tenth of a local decision.
    let mut n = itoa::Buffer::new();
    for (e, node) in entries.iter().zip(path) {
        let value = node.shared.as_deref().unwrap_or(&e.value);
        for part in [&*e.key, value] {
            out.push_str(n.format(part.len()));
            out.push(':');
            out.push_str(part);
        }
    }
    Key::from(out)
}
