//! How a script's arguments are written: straight into an `EVALSHA`
//! command for the hot path, or into the client's invocation; and the
//! units the scripts take.

use std::time::Duration;

use redis::Script;

use crate::quota::{Period, Quota};

/// A script call written straight into its command, `EVALSHA sha n keys…
/// args…`: the client's `ScriptInvocation` allocates each argument, then
/// copies them all into the command, on every decision.
pub(crate) struct Eval {
    pub(in crate::backend::redis) cmd: redis::Cmd,
    /// Loaded after `NOSCRIPT`.
    pub(in crate::backend::redis) source: &'static str,
}

impl Eval {
    /// A call of `script` (whose text is `source`) with `keys` keys, which
    /// the caller then adds before any argument, and room for `values`
    /// keys and arguments of `bytes` in all.
    pub(super) fn new(
        script: &Script,
        source: &'static str,
        keys: usize,
        (values, bytes): (usize, usize),
    ) -> Self {
        // Sized once, with the hash and the key count.
        let mut cmd = redis::Cmd::with_capacity(values + 3, bytes + 64);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self { cmd, source }
    }

    pub(super) fn arg<T: redis::ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// Where a script's arguments go: the client's invocation or an [`Eval`].
pub(super) trait Args {
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

/// Arguments written into one, each followed by a space, for `multi.lua`
/// to split: redis-rs frames, and copies, each argument of a command on
/// its own (about 300 instructions a value, against 50 here).
pub(super) struct Packed(pub(super) Vec<u8>);

impl Args for Packed {
    fn push<T: redis::ToRedisArgs>(&mut self, arg: T) {
        arg.write_redis_args(self);
    }
}

impl redis::RedisWrite for Packed {
    fn write_arg(&mut self, arg: &[u8]) {
        self.0.extend_from_slice(arg);
        self.0.push(b' ');
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        Spaced(&mut self.0)
    }
}

/// An argument written piecewise, ended by its space when done.
struct Spaced<'a>(&'a mut Vec<u8>);

impl std::io::Write for Spaced<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Spaced<'_> {
    fn drop(&mut self) {
        self.0.push(b' ');
    }
}

/// A calendar quota's three arguments: its limit, its `period` (`day` or
/// `month`, or an aligned window's length in seconds: the scripts tell it
/// from a name by its being a number) and its UTC offset in seconds.
pub(super) fn calendar_args(call: &mut impl Args, quota: &Quota, period: Period) {
    call.push(quota.limit());
    match period {
        Period::Aligned => call.push(quota.window().as_secs()),
        named => call.push(named.as_str()),
    }
    call.push(quota.utc_offset());
}

/// The window in whole microseconds, the scripts' unit (at least 1).
pub(crate) fn window_us(quota: &Quota) -> u64 {
    u64::try_from(quota.window().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whole milliseconds, at least 1, at most a century: Redis refuses an
/// expiry past its clock's range, so "for ever" is a hundred years.
pub(super) fn ms(d: Duration) -> u64 {
    const CENTURY_MS: u64 = 100 * 365 * 86_400 * 1000;
    u64::try_from(d.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, CENTURY_MS)
}
