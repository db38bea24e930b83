//! The scripts, assembled from the `.lua` files: per algorithm its rate,
//! lease and control scripts over one module (see the [module
//! page](super) for what a module defines), then the slot and instance
//! scripts.

use std::sync::LazyLock;

use redis::Script;

use crate::algorithm::Algorithm;

/// An algorithm's module after `clock.lua` (Redis time, read once per
/// call), `quota_change.lua` and the prelude the module needs: its
/// `decide`, `read_keys` and `reads` for the rate and lease scripts, its
/// `peek`, `adjust` and `reset` for the control handle's.
macro_rules! module {
    ($body:literal $(, prelude = $prelude:literal)?) => {
        concat!(
            include_str!("../lua/clock.lua"),
            include_str!("../lua/quota_change.lua"),
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
                include_str!("../lua/moved.lua"),
                "return m\nend\n",
            )?
        )
    };
}

/// An algorithm's scripts over one `decide` (the arguments after the
/// names): its rate script, `decide` then `batch.lua`, which decides each
/// request of a batch in turn, the lock check before and the lockout count
/// after (`wide` when a reply carries each window's length: a calendar
/// month's, which is its own); the control handle's operations,
/// `control.lua`, over the module with its moves (a key a reload moved is
/// changed where it went); and for a rolling algorithm (narrow replies) its
/// lease script, `decide` then `grant.lua`, which calls it.
macro_rules! scripts {
    ($rate:ident, $control:ident, wide = $wide:literal, $($decide:tt)*) => {
        const $rate: &str = concat!(
            decide!($($decide)*),
            "local wide = ",
            $wide,
            "\n",
            include_str!("../lua/batch.lua")
        );
        const $control: &str = concat!(decide!($($decide)*), include_str!("../lua/control.lua"));
    };
    ($rate:ident, $control:ident, grant = $grant:ident, $($decide:tt)*) => {
        scripts!($rate, $control, wide = "false", $($decide)*);
        const $grant: &str = concat!(decide!($($decide)*), include_str!("../lua/grant.lua"));
    };
}

scripts!(
    GCRA_LUA,
    CONTROL_GCRA_LUA,
    grant = GRANT_GCRA_LUA,
    "../lua/gcra.lua",
    prelude = "../lua/one_number.lua",
    moves = ["../lua/whole_at.lua", "../lua/one_key.lua"]
);
scripts!(
    TOKEN_BUCKET_LUA,
    CONTROL_TOKEN_BUCKET_LUA,
    grant = GRANT_TOKEN_BUCKET_LUA,
    "../lua/token_bucket.lua",
    prelude = "../lua/one_number.lua",
    moves = ["../lua/whole_at.lua", "../lua/one_key.lua"]
);
scripts!(
    FIXED_WINDOW_LUA,
    CONTROL_FIXED_WINDOW_LUA,
    grant = GRANT_FIXED_WINDOW_LUA,
    "../lua/fixed_window.lua",
    prelude = "../lua/window_end.lua",
    moves = ["../lua/fixed_window_moves.lua", "../lua/one_key.lua"]
);
scripts!(
    SLIDING_WINDOW_LUA,
    CONTROL_SLIDING_WINDOW_LUA,
    grant = GRANT_SLIDING_WINDOW_LUA,
    "../lua/sliding_window.lua",
    moves = ["../lua/sliding_window_moves.lua"]
);
// The calendar sums, then the window that uses them: one script.
scripts!(
    CALENDAR_WINDOW_LUA,
    CONTROL_CALENDAR_LUA,
    wide = "ARGV[2] == 'month'",
    "../lua/calendar_window.lua",
    prelude = "../lua/calendar.lua"
);
const SLOT_LUA: &str = concat!(
    include_str!("../lua/clock.lua"),
    include_str!("../lua/slot.lua")
);
const INSTANCES_LUA: &str = concat!(
    include_str!("../lua/clock.lua"),
    include_str!("../lua/instances.lua")
);

/// A rule's record of the quotas in play (`record`).
const QUOTAS_LUA: &str = concat!(
    include_str!("../lua/clock.lua"),
    include_str!("../lua/quotas.lua")
);

/// Every script's source, for loading them all at start-up.
pub(crate) const SOURCES: [&str; 17] = [
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
    QUOTAS_LUA,
];

/// The rate scripts in [`MULTI`]'s order: a call's place in it.
const RATES: [&str; 5] = [
    GCRA_LUA,
    TOKEN_BUCKET_LUA,
    FIXED_WINDOW_LUA,
    SLIDING_WINDOW_LUA,
    CALENDAR_WINDOW_LUA,
];

/// Every rate script as a function of its keys and arguments, and
/// `multi.lua`, which runs several calls of them in one: several rules'
/// decisions in one round trip and one script call.
pub(crate) static MULTI: LazyLock<(Script, &'static str)> = LazyLock::new(|| {
    let mut source = String::from("local run = {}\n");
    for (i, rate) in RATES.iter().enumerate() {
        source.push_str(&format!(
            "run[{}] = function(KEYS, ARGV)\n{rate}\nend\n",
            i + 1
        ));
    }
    source.push_str(include_str!("../lua/multi.lua"));
    let source: &'static str = Box::leak(source.into_boxed_str());
    (Script::new(source), source)
});

/// An algorithm's scripts, each with its text (loaded after `NOSCRIPT`).
pub(super) struct Scripts {
    pub(super) rate: (Script, &'static str),
    /// The rate script's place in [`MULTI`] (from 1, as Lua counts).
    pub(super) multi: u8,
    /// The calendar leases nothing.
    pub(super) grant: Option<Script>,
    pub(super) control: Script,
}

impl Scripts {
    /// `multi`: the rate script's index in [`RATES`].
    fn new(multi: usize, grant: Option<&'static str>, control: &'static str) -> Self {
        let rate = RATES[multi];
        Self {
            rate: (Script::new(rate), rate),
            multi: multi as u8 + 1,
            grant: grant.map(Script::new),
            control: Script::new(control),
        }
    }
}

static GCRA: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::new(0, Some(GRANT_GCRA_LUA), CONTROL_GCRA_LUA));
static TOKEN_BUCKET: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::new(1, Some(GRANT_TOKEN_BUCKET_LUA), CONTROL_TOKEN_BUCKET_LUA));
static FIXED_WINDOW: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::new(2, Some(GRANT_FIXED_WINDOW_LUA), CONTROL_FIXED_WINDOW_LUA));
static SLIDING_WINDOW: LazyLock<Scripts> = LazyLock::new(|| {
    Scripts::new(
        3,
        Some(GRANT_SLIDING_WINDOW_LUA),
        CONTROL_SLIDING_WINDOW_LUA,
    )
});
static CALENDAR: LazyLock<Scripts> = LazyLock::new(|| Scripts::new(4, None, CONTROL_CALENDAR_LUA));
pub(super) static SLOT: LazyLock<Script> = LazyLock::new(|| Script::new(SLOT_LUA));
pub(super) static INSTANCES: LazyLock<Script> = LazyLock::new(|| Script::new(INSTANCES_LUA));
pub(super) static QUOTAS: LazyLock<Script> = LazyLock::new(|| Script::new(QUOTAS_LUA));

/// The scripts of `algorithm`, or the calendar's.
pub(super) fn of(algorithm: Algorithm, calendar: bool) -> &'static Scripts {
    match (calendar, algorithm) {
        (true, _) => &CALENDAR,
        (false, Algorithm::Gcra) => &GCRA,
        (false, Algorithm::TokenBucket) => &TOKEN_BUCKET,
        (false, Algorithm::FixedWindow) => &FIXED_WINDOW,
        (false, Algorithm::SlidingWindow) => &SLIDING_WINDOW,
    }
}
