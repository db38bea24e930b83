//! The control handle's call (`control.lua`) and its reply.

use std::time::Duration;

use super::args::{calendar_args, ms, window_us};
use super::rate::{Previous, change_args};
use super::sources;
use crate::policy::ControlOp;
use crate::{algorithm::Algorithm, decision::Decision, quota::Quota};

/// The invocation of `control.lua` on the key the rate script of
/// `algorithm` (or the calendar's, when `quota` is one) names `key`, over
/// that script's module and with its quota arguments. `converts`: a count
/// of another limit reads as the next decision would read it (a rule with
/// a static quota), not as counted (a `quota_fn` rule's). With `previous`,
/// the key's states under the rule's previous quotas: converted first, as
/// before a decision.
pub(crate) fn control(
    algorithm: Algorithm,
    key: Vec<u8>,
    quota: &Quota,
    op: ControlOp,
    converts: bool,
    previous: Option<(Vec<Vec<u8>>, Previous)>,
) -> redis::ScriptInvocation<'static> {
    let script = &sources::of(algorithm, quota.period().is_some()).control;
    let mut invocation = script.key(key);
    match quota.period() {
        Some(period) => calendar_args(&mut invocation, quota, period),
        None => {
            invocation
                .arg(quota.limit())
                .arg(window_us(quota))
                .arg(quota.burst());
        }
    };
    let (name, units, block) = match op {
        ControlOp::Adjust(u) => ("adjust", u, Duration::ZERO),
        ControlOp::GiveBack(u, _) | ControlOp::Refund(u, _) => {
            ("adjust", -i64::from(u), Duration::ZERO)
        }
        ControlOp::Reset => ("reset", 0, Duration::ZERO),
        ControlOp::Block(d) => ("block", 0, d),
        ControlOp::Unblock => ("unblock", 0, Duration::ZERO),
    };
    let (window, ends_in) = match op {
        ControlOp::GiveBack(_, window) => (window.unwrap_or(0), None),
        ControlOp::Refund(_, ends_in) => (0, Some(ends_in)),
        _ => (0, None),
    };
    invocation
        .arg(name)
        .arg(units)
        .arg(ms(block))
        .arg(window)
        .arg(u8::from(converts))
        .arg(ends_in.map_or_else(String::new, |e| e.to_string()));
    if let Some((old, p)) = previous.filter(|(old, _)| !old.is_empty()) {
        for old in old {
            invocation.key(old);
        }
        change_args(&mut invocation, Some(&p));
    }
    invocation
}

/// `control.lua` returns `{remaining, wait_ms, reset_ms, locked_ms, void}`.
pub(crate) type ControlReply = (i64, i64, i64, i64, i64);

/// What a request of one unit would be told, from a control reply, and
/// whether its adjustment was void (for a window that had ended).
pub(crate) fn control_decision(
    quota: &Quota,
    (remaining, wait_ms, reset_ms, locked_ms, void): ControlReply,
) -> (Decision, bool) {
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    let (limit, window) = (quota.limit(), quota.window());
    let d = if locked_ms > 0 {
        Decision::denied(limit, window, ms(locked_ms), ms(locked_ms))
    } else if remaining > 0 {
        let remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
        Decision::allowed(limit, window, remaining, ms(reset_ms))
    } else {
        Decision::denied(limit, window, ms(wait_ms.max(1)), ms(reset_ms))
    };
    (d, void == 1)
}
