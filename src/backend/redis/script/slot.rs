//! The concurrency slots' calls (`slot.lua`) and the live instance
//! count's (`instances.lua`), with their replies.

use std::time::Duration;

use super::args::ms;
use super::sources::{INSTANCES, SLOT};

/// The invocation of `instances.lua`: announce `id` for `ttl` (or leave),
/// and count the live gateways.
pub(crate) fn instances(
    key: Vec<u8>,
    id: &str,
    ttl: Duration,
    leave: bool,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = INSTANCES.key(key);
    invocation
        .arg(if leave { "leave" } else { "announce" })
        .arg(id)
        .arg(ms(ttl));
    invocation
}

/// One call of `slot.lua`; durations are sent in whole milliseconds (at least 1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum SlotOp<'a> {
    Acquire {
        id: &'a str,
        max_in_flight: u32,
        ttl: Duration,
        retry_hint: Duration,
    },
    Release {
        id: &'a str,
    },
}

/// `slot.lua` returns `{ok, in_flight, retry_after_ms}` to an acquire or a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotReply {
    /// Acquired, released or renewed: the slot is (or was) held.
    pub(crate) ok: bool,
    pub(crate) in_flight: u32,
    /// When refused: how long until a retry may succeed.
    pub(crate) retry_after: Duration,
}

/// The invocation of `slot.lua` for `op` on the slot set `key`.
pub(crate) fn slot(key: Vec<u8>, op: SlotOp<'_>) -> redis::ScriptInvocation<'static> {
    let mut invocation = SLOT.key(key);
    match op {
        SlotOp::Acquire {
            id,
            max_in_flight,
            ttl,
            retry_hint,
        } => invocation
            .arg("acquire")
            .arg(id)
            .arg(max_in_flight)
            .arg(ms(ttl))
            .arg(ms(retry_hint)),
        SlotOp::Release { id } => invocation.arg("release").arg(id),
    };
    invocation
}

/// The invocation of `slot.lua` renewing `ids` on the slot set `key`;
/// it replies with one flag per id, 1 while the slot is held.
pub(crate) fn renew<S: AsRef<str>>(
    key: Vec<u8>,
    ids: &[S],
    ttl: Duration,
) -> redis::ScriptInvocation<'static> {
    let mut invocation = SLOT.key(key);
    invocation.arg("renew").arg(ms(ttl));
    for id in ids {
        invocation.arg(id.as_ref());
    }
    invocation
}

pub(crate) fn slot_reply((ok, in_flight, retry_ms): (i64, i64, i64)) -> SlotReply {
    SlotReply {
        ok: ok == 1,
        in_flight: u32::try_from(in_flight.max(0)).unwrap_or(u32::MAX),
        retry_after: Duration::from_millis(u64::try_from(retry_ms).unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::script::args::ms;

    #[test]
    fn slot_replies_and_args() {
        let r = slot_reply((0, 2, 250));
        assert_eq!((r.ok, r.in_flight), (false, 2));
        assert_eq!(r.retry_after, Duration::from_millis(250));
        assert!(slot_reply((1, 1, 0)).ok);
        assert_eq!(ms(Duration::from_micros(10)), 1, "never a zero TTL");
        assert_eq!(ms(Duration::MAX), 100 * 365 * 86_400 * 1000, "for ever");
    }
}
