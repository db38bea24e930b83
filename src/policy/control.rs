//! What the control handle (and a lease giving units back) does to a key.

use std::time::Duration;

/// One operation on one key of one rule: what
/// [`Control`](crate::rate_limit::Control) asks, and what a Redis lease
/// gives back. The engine runs it on a rule's store; the Redis backend
/// turns it into a `control.lua` call.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ControlOp {
    /// Spend (positive) or give back (negative) units; 0 only reads.
    Adjust(i64),
    /// Units of a lease given back; for a window, to the window it names.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    GiveBack(u32, Option<u64>),
    /// Units a request spent, given back to the window it was charged in,
    /// which ends this many ms from now (the charge's reset, less the time
    /// since): void when that window is not the current one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Refund(u32, i64),
    Reset,
    Block(Duration),
    Unblock,
}
