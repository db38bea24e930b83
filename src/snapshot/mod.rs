//! Local counters saved and loaded across restarts.
//!
//! A single-instance deploy keeps its limits in memory, so without a
//! snapshot a restart hands every client a fresh quota. [`RateLimitLayer::snapshot`](crate::RateLimitLayer::snapshot)
//! writes each local rule's counters, and
//! [`RateLimitBuilder::restore`](crate::rate_limit::RateLimitBuilder::restore) loads
//! them into the next process's rules:
//!
//! - rules are matched by name; a rule the snapshot doesn't name starts
//!   afresh, and a saved rule no longer in the chain is ignored;
//! - times are stored as wall-clock instants, so a restart after `d` counts
//!   `d` as elapsed: units come back while the process is down, and a
//!   calendar window that ended meanwhile is not restored;
//! - a rule whose quota changed since follows its
//!   [`QuotaChange`](crate::rule::QuotaChange), as on a reload;
//! - a corrupt, truncated or foreign file is a [`SnapshotError`], never a
//!   panic, and nothing is restored from it.
//!
//! Saved: local rules with a static quota, rolling or calendar. Not saved:
//! global rules (their state is in Redis already), `quota_fn` rules, locks
//! and lockouts, the control handle's blocks.
//!
//! ```
//! use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rule = || Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_hour(100));
//! let layer = RateLimitLayer::builder().rule(rule()).build()?;
//! layer.control().penalize("api", "alice", 30).await?;
//!
//! let mut saved = Vec::new();
//! layer.snapshot(&mut saved)?;
//!
//! // The next process.
//! let layer = RateLimitLayer::builder().rule(rule()).restore(&saved[..])?.build()?;
//! assert_eq!(layer.control().peek("api", "alice").await?.remaining(), 70);
//! # Ok(()) }
//! ```
//!
//! The `snapshot` example saves on SIGTERM and restores at start.
//!
//! # Format, version 1
//!
//! UTF-8 text, one record per line, fields separated by one space; names
//! and keys in lowercase hex (they may be any bytes):
//!
//! ```text
//! keyed-rate-limit snapshot 1
//! written <unix µs>
//! rule <name> rolling <limit> <window ns> <burst>
//! key <key> <unix µs when the key's bucket is whole again>
//! rule <name> calendar <limit> <day|month> <UTC offset s>
//! rule <name> calendar <limit> aligned <UTC offset s> <window s>
//! key <key> <count> <unix s when its window ends>
//! end <number of lines before this one> <SHA-256 of every byte before this line, hex>
//! ```
//!
//! Each `key` line belongs to the `rule` line before it. A reader refuses a
//! file whose first line is not the header ([`SnapshotError::NotASnapshot`]),
//! a later version ([`SnapshotError::Version`]), and one whose `end` line is
//! missing or does not match, or that holds a quota of zero
//! ([`SnapshotError::Corrupt`]).

mod format;

pub(crate) use format::{read, write};

use crate::key::Key;
use crate::quota::Quota;

/// The format version this crate writes and reads.
pub(crate) const VERSION: u32 = 1;

/// One rule's counters as saved.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SavedRule {
    pub(crate) name: String,
    pub(crate) state: Saved,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Saved {
    /// A rolling quota: each key with the wall-clock µs when it is whole.
    Rolling {
        limit: u32,
        window_ns: u64,
        burst: u32,
        keys: Vec<(Key, i64)>,
    },
    /// A calendar quota (its limit, period, UTC offset and, for an aligned
    /// one, its window): each key's count, and when its window ends (s).
    Calendar {
        quota: Quota,
        keys: Vec<(Key, u32, i64)>,
    },
}

/// Why a snapshot could not be written or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading or writing failed.
    Io(std::io::Error),
    /// The first line is not this crate's header: not a snapshot.
    NotASnapshot,
    /// Written by a later version of the format.
    Version(u32),
    /// A line is malformed, or the `end` line is missing or does not match.
    Corrupt {
        /// The 1-based line.
        line: usize,
        /// What is wrong.
        what: &'static str,
    },
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(e) => write!(f, "rate-limit snapshot: {e}"),
            Self::NotASnapshot => f.write_str("not a keyed-rate-limit snapshot"),
            Self::Version(v) => write!(
                f,
                "rate-limit snapshot version {v}; this version reads {VERSION}"
            ),
            Self::Corrupt { line, what } => {
                write!(f, "rate-limit snapshot corrupt at line {line}: {what}")
            }
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for SnapshotError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}
