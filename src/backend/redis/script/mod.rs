//! The Lua scripts: assembled per algorithm from the `.lua` files
//! (`sources`), and the calls that run them, each beside the reply it
//! decodes: a batch of rate decisions (`rate`), several rules' in one call
//! (`multi`), a lease (`lease`), the
//! control handle (`control`), concurrency slots and the live instance
//! count (`slot`), a rule's record of the quotas in play (`record`), over
//! one way of writing arguments (`args`).
//!
//! # An algorithm's module
//!
//! Each algorithm is one file of `lua/` (`gcra.lua`, `token_bucket.lua`,
//! `fixed_window.lua`, `sliding_window.lua`, `calendar_window.lua`), which
//! every script of that algorithm includes after `clock.lua` (`now`, in µs
//! of Redis time, and `now_ms`, read once per call), `quota_change.lua`
//! (the call's quota `own_l`, `own_w`, `own_b` from `ARGV[1..3]`,
//! `changed_from(i)`, `converted`) and the prelude it names. A module
//! defines, as locals the script after it calls:
//!
//! - `set_frame(limit, window_us, burst)`: the quota decisions are made
//!   in (the call's, or a moved state's);
//! - `read_keys(key, list, n)` and `reads`: the values `batch.lua` reads
//!   ahead for a key in one `MGET` (`reads` of them);
//! - `decide(key, cost, of_window, vals, at)` → `allowed, remaining,
//!   wait_ms, reset_ms[, window_s, left_ms, window_id]`: one decision of
//!   `cost` units (a negative cost gives units back, to the window
//!   `of_window` names when it names one); `vals[at]` is the key's value read ahead, `vals` nil
//!   to read it here; on a deny `wait_ms` is the retry-after, on an allow
//!   the wait until one unit more than `remaining` fits; a deny writes
//!   nothing (the fixed window's count-first residue aside); a window's
//!   allow also returns, for `grant.lua`, the time left in its window and
//!   the window's name (`window_s` is the calendar's length, nil
//!   otherwise). Results pass in returns, not shared locals: those are
//!   the clock, the call's quota and the frame `set_frame` sets;
//! - `peek(key)` → `remaining, wait_ms, reset_ms`, `adjust(key, units,
//!   of_window, ends_in)` → `true` when void, `reset(key)`: the control
//!   handle's;
//! - for the rolling algorithms, their moves inside `moves()`
//!   (`moved.lua` after the algorithm's own files among `whole_at.lua`,
//!   `one_key.lua` and its `*_moves.lua`): the functions
//!   `m.capacity`, `m.absent`, `m.movable`, `m.move` and `m.bury`, and the
//!   flag `m.counts`.
//!
//! The scripts after a module: `batch.lua` (a batch of rate decisions;
//! its `KEYS` and `ARGV` are written by [`rate`]),
//! `grant.lua` (a lease), `control.lua` (the control handle). `slot.lua`
//! and `instances.lua` take the clock alone.

mod args;
mod control;
mod lease;
mod multi;
mod rate;
pub(in crate::backend::redis) mod record;
mod slot;
mod sources;

pub(crate) use args::Eval;
pub(crate) use control::{ControlReply, control, control_decision};
pub(crate) use lease::{Grant, GrantReply, LeaseAsk, grant, grant_reply};
pub(crate) use multi::{Part, multi, replies};
pub(crate) use rate::{
    BatchKeys, Decided, Item, Locking, MAX_PREVIOUS, Previous, Target, batch_decisions, rate,
};
pub(crate) use record::Record;
pub(crate) use slot::{SlotOp, SlotReply, instances, renew, slot, slot_reply};
pub(crate) use sources::{MULTI, SOURCES};
