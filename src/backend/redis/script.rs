//! The Lua scripts, assembled per algorithm from their `.lua` files; the
//! calls that run them (rate, lease, control, slot, instances); and the
//! replies each call decodes.

use crate::policy::ControlOp;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::policy::Lockout;
use crate::quota::Period;
use crate::{algorithm::Algorithm, decision::Decision, quota::Quota};

/// An algorithm's module after `clock.lua` (Redis time, read once per
/// call), `quota_change.lua` and the prelude the module needs: its
/// `decide`, `read_keys` and `reads` for the rate and lease scripts, its
/// `peek`, `adjust` and `reset` for the control handle's.
macro_rules! module {
    ($body:literal $(, prelude = $prelude:literal)?) => {
        concat!(
            include_str!("lua/clock.lua"),
            include_str!("lua/quota_change.lua"),
            $(include_str!($prelude),)?
            include_str!($body),
        )
    };
}

/// A module, then, for the rolling algorithms, `moves()`: their own moves
/// of a quota change (ADR 25) and `moved.lua`, made only in a call that
/// needs them.
macro_rules! decide {
    ($body:literal $(, prelude = $prelude:literal)? $(, moves = [$($moves:literal),*])?) => {
        concat!(
            module!($body $(, prelude = $prelude)?),
            $(
                "moves = function()\nif made then return made end\nmade = {}\nlocal m = made\n",
                $(include_str!($moves),)*
                include_str!("lua/moved.lua"),
                "return m\nend\n",
            )?
        )
    };
}

/// A rate script: `decide`, then `batch.lua`, which decides each request
/// of a batch in turn, the lock check before and the lockout count after.
macro_rules! batched {
    ($body:literal, wide = $wide:literal $(, prelude = $prelude:literal)? $(, moves = [$($moves:literal),*])?) => {
        concat!(
            decide!($body $(, prelude = $prelude)? $(, moves = [$($moves),*])?),
            "local wide = ",
            $wide,
            "\n",
            include_str!("lua/batch.lua")
        )
    };
}

/// A lease script: `decide`, then `grant.lua`, which calls it.
macro_rules! granting {
    ($body:literal $(, prelude = $prelude:literal)? $(, moves = [$($moves:literal),*])?) => {
        concat!(
            decide!($body $(, prelude = $prelude)? $(, moves = [$($moves),*])?),
            include_str!("lua/grant.lua")
        )
    };
}

const GCRA_LUA: &str = batched!(
    "lua/gcra.lua",
    wide = "false",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const TOKEN_BUCKET_LUA: &str = batched!(
    "lua/token_bucket.lua",
    wide = "false",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const FIXED_WINDOW_LUA: &str = batched!(
    "lua/fixed_window.lua",
    wide = "false",
    prelude = "lua/window_end.lua",
    moves = ["lua/fixed_window_moves.lua", "lua/one_key.lua"]
);
const SLIDING_WINDOW_LUA: &str = batched!(
    "lua/sliding_window.lua",
    wide = "false",
    moves = ["lua/sliding_window_moves.lua"]
);
/// The calendar sums, then the window that uses them: one script.
const CALENDAR_WINDOW_LUA: &str = batched!(
    "lua/calendar_window.lua",
    wide = "true",
    prelude = "lua/calendar.lua"
);
const GRANT_GCRA_LUA: &str = granting!(
    "lua/gcra.lua",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const GRANT_TOKEN_BUCKET_LUA: &str = granting!(
    "lua/token_bucket.lua",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const GRANT_FIXED_WINDOW_LUA: &str = granting!(
    "lua/fixed_window.lua",
    prelude = "lua/window_end.lua",
    moves = ["lua/fixed_window_moves.lua", "lua/one_key.lua"]
);
const GRANT_SLIDING_WINDOW_LUA: &str = granting!(
    "lua/sliding_window.lua",
    moves = ["lua/sliding_window_moves.lua"]
);
/// The control handle's operations over an algorithm's module, with its
/// moves (a key a reload moved is changed where it went).
macro_rules! controlling {
    ($body:literal $(, prelude = $prelude:literal)? $(, moves = [$($moves:literal),*])?) => {
        concat!(
            decide!($body $(, prelude = $prelude)? $(, moves = [$($moves),*])?),
            include_str!("lua/control.lua")
        )
    };
}
const CONTROL_GCRA_LUA: &str = controlling!(
    "lua/gcra.lua",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const CONTROL_TOKEN_BUCKET_LUA: &str = controlling!(
    "lua/token_bucket.lua",
    prelude = "lua/one_number.lua",
    moves = ["lua/whole_at.lua", "lua/one_key.lua"]
);
const CONTROL_FIXED_WINDOW_LUA: &str = controlling!(
    "lua/fixed_window.lua",
    prelude = "lua/window_end.lua",
    moves = ["lua/fixed_window_moves.lua", "lua/one_key.lua"]
);
const CONTROL_SLIDING_WINDOW_LUA: &str = controlling!(
    "lua/sliding_window.lua",
    moves = ["lua/sliding_window_moves.lua"]
);
const CONTROL_CALENDAR_LUA: &str =
    controlling!("lua/calendar_window.lua", prelude = "lua/calendar.lua");
const SLOT_LUA: &str = concat!(include_str!("lua/clock.lua"), include_str!("lua/slot.lua"));
const INSTANCES_LUA: &str = concat!(
    include_str!("lua/clock.lua"),
    include_str!("lua/instances.lua")
);

/// Every script's source, for loading them all at start-up.
pub(crate) const SOURCES: [&str; 16] = [
    GRANT_GCRA_LUA,
    GRANT_TOKEN_BUCKET_LUA,
    GRANT_FIXED_WINDOW_LUA,
    GRANT_SLIDING_WINDOW_LUA,
    GCRA_LUA,
    TOKEN_BUCKET_LUA,
    FIXED_WINDOW_LUA,
    SLIDING_WINDOW_LUA,
    SLOT_LUA,
    CALENDAR_WINDOW_LUA,
    CONTROL_GCRA_LUA,
    CONTROL_TOKEN_BUCKET_LUA,
    CONTROL_FIXED_WINDOW_LUA,
    CONTROL_SLIDING_WINDOW_LUA,
    CONTROL_CALENDAR_LUA,
    INSTANCES_LUA,
];

static GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(GCRA_LUA));
static TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(TOKEN_BUCKET_LUA));
static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(FIXED_WINDOW_LUA));
static SLIDING_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING_WINDOW_LUA));
static SLOT: LazyLock<Script> = LazyLock::new(|| Script::new(SLOT_LUA));
static CALENDAR_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(CALENDAR_WINDOW_LUA));
static CONTROL_GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(CONTROL_GCRA_LUA));
static CONTROL_TOKEN_BUCKET: LazyLock<Script> =
    LazyLock::new(|| Script::new(CONTROL_TOKEN_BUCKET_LUA));
static CONTROL_FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(CONTROL_FIXED_WINDOW_LUA));
static CONTROL_SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(CONTROL_SLIDING_WINDOW_LUA));
static CONTROL_CALENDAR: LazyLock<Script> = LazyLock::new(|| Script::new(CONTROL_CALENDAR_LUA));
static INSTANCES: LazyLock<Script> = LazyLock::new(|| Script::new(INSTANCES_LUA));
static GRANT_GCRA: LazyLock<Script> = LazyLock::new(|| Script::new(GRANT_GCRA_LUA));
static GRANT_TOKEN_BUCKET: LazyLock<Script> = LazyLock::new(|| Script::new(GRANT_TOKEN_BUCKET_LUA));
static GRANT_FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(GRANT_FIXED_WINDOW_LUA));
static GRANT_SLIDING_WINDOW: LazyLock<Script> =
    LazyLock::new(|| Script::new(GRANT_SLIDING_WINDOW_LUA));

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

/// The script for an algorithm and its text; all take `ARGV = limit,
/// window_us, burst`, then the batch (see [`batch_call`]).
fn script(algorithm: Algorithm) -> (&'static Script, &'static str) {
    match algorithm {
        Algorithm::Gcra => (&GCRA, GCRA_LUA),
        Algorithm::TokenBucket => (&TOKEN_BUCKET, TOKEN_BUCKET_LUA),
        Algorithm::FixedWindow => (&FIXED_WINDOW, FIXED_WINDOW_LUA),
        Algorithm::SlidingWindow => (&SLIDING_WINDOW, SLIDING_WINDOW_LUA),
    }
}

/// One request of a batch: the index of its key among the batch's keys,
/// and its cost.
pub(crate) type Item = (usize, u32);

/// A batch's keys for one key of it: its state, its lock when the rule
/// can be locked, and when a reload changed the quota of a rolling rule,
/// its states under the previous quotas.
pub(crate) type BatchKeys = (Vec<u8>, Option<Vec<u8>>, Vec<Vec<u8>>);

/// A script call written straight into its command, `EVALSHA sha n keys…
/// args…`: the client's `ScriptInvocation` allocates each argument, then
/// copies them all into the command, on every decision.
pub(crate) struct Eval {
    pub(super) cmd: redis::Cmd,
    /// Loaded after `NOSCRIPT`.
    pub(super) source: &'static str,
}

impl Eval {
    /// A call of `script` (whose text is `source`) with `keys` keys, which
    /// the caller then adds before any argument.
    fn new(script: &Script, source: &'static str, keys: usize, key_bytes: usize) -> Self {
        // Sized once: the batch's arguments past the keys are a few dozen
        // short numbers.
        let mut cmd = redis::Cmd::with_capacity(keys + 32, key_bytes + 160);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self { cmd, source }
    }

    fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// What a rule decides with in Redis: its name, algorithm and quota, and
/// what its scripts do with a key's lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) rule: &'a str,
    pub(crate) algorithm: Algorithm,
    pub(crate) quota: &'a Quota,
    pub(crate) locks: Locking,
}

/// A rule's locks in its rate scripts. A rule that cannot be locked (no
/// lockout, not [blockable](crate::Rule::blockable)) reads no lock key:
/// one Redis read less per decision.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Locking {
    /// Each key's lock is read before its decision.
    pub(crate) read: bool,
    /// Denies counted toward a lock; only with `read`.
    pub(crate) lockout: Option<Lockout>,
}

/// The most previous quotas a conversion converts from: a gateway that
/// reloads again while it converts keeps converting from the older ones.
pub(crate) const MAX_PREVIOUS: usize = 3;

/// How a call treats usage counted under another quota (ADR 21 and 25).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Previous {
    /// The rule's previous quotas, most recent first, as Redis counted them.
    pub(crate) quotas: [Option<Quota>; MAX_PREVIOUS],
    /// What usage under one of them becomes; `None`: a calendar count of
    /// another limit stays as it is (a `quota_fn` rule's plan changed).
    pub(crate) how: Option<crate::policy::QuotaChange>,
    /// The reload's second since the epoch: a calendar count converts by
    /// `how` in a window that began before it.
    pub(crate) at: i64,
}

impl Previous {
    /// Counts of another limit stay as they are.
    pub(crate) const AS_COUNTED: Self = Self {
        quotas: [None; MAX_PREVIOUS],
        how: None,
        at: 0,
    };

    pub(crate) fn quotas(&self) -> impl Iterator<Item = &Quota> {
        self.quotas.iter().flatten()
    }

    fn mode(this: Option<&Self>) -> u8 {
        use crate::policy::QuotaChange;
        match this.map(|p| p.how) {
            // A call that knows no previous quota converts a count of
            // another limit (a gateway on other rules) proportionally.
            None | Some(Some(QuotaChange::Proportional)) => 1,
            Some(None) => 0,
            Some(Some(QuotaChange::AsIs)) => 2,
            Some(Some(QuotaChange::Reset)) => 3,
        }
    }
}

/// The invocation of an algorithm's script deciding `items` in turn over
/// `keys` (one reply each, concatenated). Every key must hash to one
/// cluster slot when the server is a cluster.
pub(crate) fn rate(
    algorithm: Algorithm,
    keys: Vec<BatchKeys>,
    quota: &Quota,
    items: &[Item],
    locks: Locking,
    previous: Option<Previous>,
) -> Eval {
    let (script, source) = script(algorithm);
    batch_call(script, source, keys, items, locks, previous, |eval| {
        eval.arg(quota.limit())
            .arg(window_us(quota))
            .arg(quota.burst());
    })
}

/// `batch.lua`'s keys: per key its state, its lock when the rule reads
/// locks, and its states under the previous quotas while a conversion
/// lasts; and `ARGV[4..]`: whether locks are read, the lockout's three,
/// the keys per key, the previous quotas (`changed_from` in
/// quota_change.lua), then a pair (key number, from 1, and cost) per
/// request, or none when each key is decided once for one unit, in order
/// (the script then reads the batch's states in one MGET).
fn batch_call(
    script: &Script,
    source: &'static str,
    keys: Vec<BatchKeys>,
    items: &[Item],
    locks: Locking,
    previous: Option<Previous>,
    quota_args: impl FnOnce(&mut Eval),
) -> Eval {
    let n = previous.map_or(0, |p| p.quotas().count());
    let declared = n > 0 && keys.iter().all(|k| k.2.len() == n);
    let once = items.len() == keys.len()
        && items
            .iter()
            .enumerate()
            .all(|(i, &(index, cost))| index == i && cost == 1);
    let stride = 1 + usize::from(locks.read) + if declared { n } else { 0 };
    let key_bytes = keys
        .iter()
        .map(|(state, lock, old)| {
            state.len()
                + lock.as_ref().map_or(0, Vec::len)
                + old.iter().map(Vec::len).sum::<usize>()
        })
        .sum();
    let mut eval = Eval::new(script, source, stride * keys.len(), key_bytes);
    for (state, lock, old) in &keys {
        eval.arg(&state[..]);
        // `batch_keys` builds a lock exactly when the rule reads locks.
        if let Some(lock) = lock {
            eval.arg(&lock[..]);
        }
        if declared {
            for old in old {
                eval.arg(&old[..]);
            }
        }
    }
    quota_args(&mut eval);
    eval.arg(u8::from(locks.read));
    match locks.lockout.filter(|_| locks.read) {
        Some(l) => eval.arg(l.after).arg(ms(l.within)).arg(ms(l.block_for)),
        None => eval.arg(0).arg(1).arg(1),
    };
    eval.arg(stride);
    change_args(&mut eval, previous.as_ref());
    if !once {
        for &(index, cost) in items {
            eval.arg(index + 1).arg(cost);
        }
    }
    eval
}

/// A gateway's ask for a lease: `need` units or none, up to `want`, for
/// `holder`, lasting at most `lease`, after giving back `back` units of its
/// last lease (for a window, of the window it names).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseAsk<'a> {
    pub(crate) need: u32,
    pub(crate) want: u32,
    pub(crate) holder: &'a str,
    pub(crate) lease: Duration,
    pub(crate) back: (u32, Option<u64>),
}

/// The invocation of an algorithm's lease script for `ask`.
pub(crate) fn grant(
    algorithm: Algorithm,
    key: Vec<u8>,
    quota: &Quota,
    ask: LeaseAsk<'_>,
    previous: Option<(Vec<Vec<u8>>, Previous)>,
) -> redis::ScriptInvocation<'static> {
    let LeaseAsk {
        need,
        want,
        holder,
        lease,
        back: (back, back_window),
    } = ask;
    let script: &Script = match algorithm {
        Algorithm::Gcra => &GRANT_GCRA,
        Algorithm::TokenBucket => &GRANT_TOKEN_BUCKET,
        Algorithm::FixedWindow => &GRANT_FIXED_WINDOW,
        Algorithm::SlidingWindow => &GRANT_SLIDING_WINDOW,
    };
    let mut invocation = script.key(key);
    invocation
        .arg(quota.limit())
        .arg(window_us(quota))
        .arg(quota.burst())
        .arg(need)
        .arg(want)
        .arg(holder)
        .arg(ms(lease))
        .arg(back)
        .arg(back_window.unwrap_or(0));
    if let Some((old, p)) = previous.filter(|(old, _)| !old.is_empty()) {
        for old in old {
            invocation.key(old);
        }
        change_args(&mut invocation, Some(&p));
    }
    invocation
}

/// `changed_from`'s arguments (quota_change.lua): how many previous quotas,
/// each one's limit, window_us and burst, the mode and the reload's second.
fn change_args(call: &mut impl Args, previous: Option<&Previous>) {
    let quotas = || previous.into_iter().flat_map(Previous::quotas);
    call.push(quotas().count());
    for q in quotas() {
        call.push(q.limit());
        call.push(window_us(q));
        call.push(q.burst());
    }
    call.push(Previous::mode(previous));
    call.push(previous.map_or(0, |p| p.at));
}

/// Where a script's arguments go: the client's invocation or an [`Eval`].
trait Args {
    fn push<T: redis::ToRedisArgs>(&mut self, arg: T);
}

impl Args for redis::ScriptInvocation<'_> {
    fn push<T: redis::ToRedisArgs>(&mut self, arg: T) {
        self.arg(arg);
    }
}

impl Args for Eval {
    fn push<T: redis::ToRedisArgs>(&mut self, arg: T) {
        self.arg(arg);
    }
}

/// `grant.lua` returns `{granted, remaining, wait_ms, reset_ms, lease_ms,
/// window}`.
pub(crate) type GrantReply = (i64, i64, i64, i64, i64, i64);

/// A lease script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Grant {
    /// Units leased; 0 when `need` did not fit.
    pub(crate) granted: u32,
    /// Whole units still free in Redis after the grant.
    pub(crate) remaining: u32,
    /// On a deny, when `need` fits; on a grant, the wait for one more unit.
    pub(crate) wait: Duration,
    pub(crate) reset: Duration,
    /// How long the lease may be spent (to its window's end at most).
    pub(crate) lease: Duration,
    /// For a window algorithm, the window the lease is in: its unspent
    /// units go back to that window only.
    pub(crate) window: Option<u64>,
}

pub(crate) fn grant_reply((granted, remaining, wait, reset, lease, window): GrantReply) -> Grant {
    let n = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Grant {
        granted: n(granted),
        remaining: n(remaining),
        wait: ms(wait),
        reset: ms(reset),
        lease: ms(lease),
        window: u64::try_from(window).ok().filter(|w| *w > 0),
    }
}

/// The invocation of `calendar_window.lua` for a calendar quota deciding
/// `items` in turn over `keys`.
pub(crate) fn calendar(
    keys: Vec<BatchKeys>,
    quota: &Quota,
    period: Period,
    items: &[Item],
    locks: Locking,
    previous: Option<Previous>,
) -> Eval {
    batch_call(
        &CALENDAR_WINDOW,
        CALENDAR_WINDOW_LUA,
        keys,
        items,
        locks,
        previous,
        |eval| {
            eval.arg(quota.limit())
                .arg(period.as_str())
                .arg(quota.utc_offset());
        },
    )
}

/// Values per request in a rate script's reply: code, wait_ms, reset_ms.
pub(crate) const NARROW: usize = 3;
/// Values per request in the calendar's reply: the window's length in
/// seconds (a month's is its own) after the others.
pub(crate) const WIDE: usize = 4;

/// A batch's replies, one per cost in order: `width` values each
/// ([`NARROW`] or [`WIDE`]).
pub(crate) fn batch_decisions(quota: &Quota, flat: &[i64], width: usize) -> Vec<Decided> {
    flat.chunks_exact(width)
        .map(|r| {
            let mut decided = decision(quota, (r[0], r[1], r[2]));
            if width == WIDE && !decided.locked {
                let window = Duration::from_secs(u64::try_from(r[3]).unwrap_or(0));
                decided.decision = decided.decision.with_window(window);
            }
            decided
        })
        .collect()
}

/// A rate script's answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Decided {
    pub(crate) decision: Decision,
    /// For an allow that left nothing: the wait until one more unit fits.
    pub(crate) next: Option<Duration>,
    /// The key is locked; the decision's wait is the lock's time left.
    pub(crate) locked: bool,
    /// This decision's deny is the one that locked it.
    pub(crate) lock_started: bool,
}

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
    let script: &Script = match (quota.period(), algorithm) {
        (Some(_), _) => &CONTROL_CALENDAR,
        (None, Algorithm::Gcra) => &CONTROL_GCRA,
        (None, Algorithm::TokenBucket) => &CONTROL_TOKEN_BUCKET,
        (None, Algorithm::FixedWindow) => &CONTROL_FIXED_WINDOW,
        (None, Algorithm::SlidingWindow) => &CONTROL_SLIDING_WINDOW,
    };
    let mut invocation = script.key(key);
    match quota.period() {
        Some(period) => invocation
            .arg(quota.limit())
            .arg(period.as_str())
            .arg(quota.utc_offset()),
        None => invocation
            .arg(quota.limit())
            .arg(window_us(quota))
            .arg(quota.burst()),
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

/// The window in whole microseconds, the scripts' unit (at least 1).
pub(crate) fn window_us(quota: &Quota) -> u64 {
    u64::try_from(quota.window().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Every rate script returns `{code, wait_ms, reset_ms}` per request: the
/// code is `remaining` on an allow, -1 on a deny, -2 for a key locked
/// already and -3 for the deny that locked it; wait_ms is on a deny the
/// retry-after, on an allow the wait until one more unit fits.
pub(crate) type Reply = (i64, i64, i64);

/// Turns a script reply into a decision with exact header values.
pub(crate) fn decision(quota: &Quota, reply: Reply) -> Decided {
    let (code, wait_ms, reset_ms) = reply;
    let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
    if code >= 0 {
        let remaining = code;
        let remaining = u32::try_from(remaining.max(0)).unwrap_or(u32::MAX);
        let next = (remaining == 0 && wait_ms > 0).then(|| ms(wait_ms));
        let d = Decision::allowed(quota.limit(), quota.window(), remaining, ms(reset_ms))
            .with_next_unit(ms(wait_ms));
        Decided {
            decision: d,
            next,
            locked: false,
            lock_started: false,
        }
    } else {
        let d = Decision::denied(
            quota.limit(),
            quota.window(),
            ms(wait_ms.max(1)),
            ms(reset_ms),
        );
        Decided {
            decision: d,
            next: None,
            locked: code <= -2,
            lock_started: code == -3,
        }
    }
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
    /// Acquired, released or renewed: the lease is (or was) held.
    pub(crate) ok: bool,
    pub(crate) in_flight: u32,
    /// When refused: how long until a retry may succeed.
    pub(crate) retry_after: Duration,
}

/// Whole milliseconds, at least 1, at most a century: Redis refuses an
/// expiry past its clock's range, so "for ever" is a hundred years.
fn ms(d: Duration) -> u64 {
    const CENTURY_MS: u64 = 100 * 365 * 86_400 * 1000;
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, CENTURY_MS)
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
/// it replies with one flag per id, 1 while the lease is held.
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

    #[test]
    fn replies_map_to_decisions() {
        let q = Quota::per_minute(10);
        let Decided {
            decision: d, next, ..
        } = decision(&q, (9, 0, 6000));
        assert!(d.is_allowed());
        assert_eq!(
            (d.remaining(), d.reset(), next),
            (9, Duration::from_secs(6), None)
        );
        let Decided {
            decision: d, next, ..
        } = decision(&q, (0, 700, 6000));
        assert!(d.is_allowed() && d.retry_after().is_none());
        assert_eq!(
            next,
            Some(Duration::from_millis(700)),
            "the wait for the next unit"
        );
        let r = decision(&q, (-1, 1500, 60_000));
        assert_eq!(
            (r.decision.retry_after(), r.next, r.locked),
            (Some(Duration::from_millis(1500)), None, false)
        );
        let r = decision(&q, (-2, 900_000, 900_000));
        assert!(r.locked && !r.lock_started);
        assert!(decision(&q, (-3, 900_000, 900_000)).lock_started);
        assert_eq!(r.decision.retry_after(), Some(Duration::from_secs(900)));
    }

    #[test]
    fn lease_replies_and_args() {
        let r = slot_reply((0, 2, 250));
        assert_eq!((r.ok, r.in_flight), (false, 2));
        assert_eq!(r.retry_after, Duration::from_millis(250));
        assert!(slot_reply((1, 1, 0)).ok);
        assert_eq!(ms(Duration::from_micros(10)), 1, "never a zero TTL");
        assert_eq!(ms(Duration::MAX), 100 * 365 * 86_400 * 1000, "for ever");
    }
}
