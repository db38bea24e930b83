//! How a global rule survives a failing Redis: the mode, the timeout and
//! the breaker's settings.

use std::fmt;
use std::time::Duration;

/// What a global rule decides when Redis errors, times out, or its circuit
/// breaker is open.
///
/// | mode | decision | use it when |
/// |---|---|---|
/// | `FailOpen` | allow; the rule's headers are left out | availability beats the limit (read traffic) |
/// | `FailClosed` | 429 with `Retry-After` (never 503) | the limit protects something that must not be overrun |
/// | `LocalFallback` (default) | this gateway's share: the quota divided by the live gateway count its Redis backend keeps (`RedisBackendBuilder::live_instances`), never by less than [`RateLimitBuilder::instances`](crate::rate_limit::RateLimitBuilder::instances), on `governor` | most APIs: still limited, a little looser or tighter |
/// | `RefusePercent(p)` | refuse `p` % of the requests (429 with `Retry-After`), allow the rest as `FailOpen` does | abuse-prone routes: shed load without closing the door (Envoy's `failure_mode_deny_percent`) |
///
/// ```
/// use keyed_rate_limit::failure::FailureMode;
/// assert_eq!(FailureMode::default(), FailureMode::LocalFallback);
/// assert_eq!(FailureMode::FailClosed.as_str(), "fail_closed");
/// assert_eq!(FailureMode::RefusePercent(25).to_string(), "refuse_percent 25");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Let the request through.
    FailOpen,
    /// Refuse the request with 429.
    FailClosed,
    /// Enforce this instance's share of the quota locally.
    #[default]
    LocalFallback,
    /// Refuse this percentage (0 to 100) of the requests that reach the
    /// mode, evenly spread, and let the rest through. Each gateway counts
    /// them per rule, so over any `n` consecutive such requests it refuses
    /// `n × p / 100` rounded down or up: never one more or one fewer.
    RefusePercent(u8),
}

impl FailureMode {
    /// A short, stable name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::LocalFallback => "local_fallback",
            Self::RefusePercent(_) => "refuse_percent",
        }
    }
}

/// In rules files: a name, or `{ refuse_percent = p }` (a map in YAML too,
/// where a derived enum would want a tag).
#[cfg(feature = "config")]
impl<'de> serde::Deserialize<'de> for FailureMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, MapAccess, Visitor};
        const NAMES: &[&str] = &[
            "fail_open",
            "fail_closed",
            "local_fallback",
            "refuse_percent",
        ];
        struct Mode;
        impl<'de> Visitor<'de> for Mode {
            type Value = FailureMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("fail_open, fail_closed, local_fallback or { refuse_percent = p }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FailureMode, E> {
                match v {
                    "fail_open" => Ok(FailureMode::FailOpen),
                    "fail_closed" => Ok(FailureMode::FailClosed),
                    "local_fallback" => Ok(FailureMode::LocalFallback),
                    other => Err(E::unknown_variant(other, NAMES)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FailureMode, A::Error> {
                let Some(key) = map.next_key::<String>()? else {
                    return Err(de::Error::invalid_length(0, &self));
                };
                if key != "refuse_percent" {
                    return Err(de::Error::unknown_variant(&key, &["refuse_percent"]));
                }
                let p = map.next_value()?;
                match map.next_key::<String>()? {
                    None => Ok(FailureMode::RefusePercent(p)),
                    Some(_) => Err(de::Error::invalid_length(2, &self)),
                }
            }
        }
        d.deserialize_any(Mode)
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        match self {
            Self::RefusePercent(p) => write!(f, " {p}"),
            _ => Ok(()),
        }
    }
}

/// How a global rule survives a failing Redis: the mode, the time one
/// decision may wait for Redis, and the circuit breaker.
///
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FailurePolicy {
    /// What to decide without Redis.
    pub(crate) mode: FailureMode,
    /// How long one decision waits for Redis (default 20 ms).
    pub(crate) timeout: Duration,
    /// When to stop asking Redis, and when to try again.
    pub(crate) breaker: BreakerConfig,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            mode: FailureMode::default(),
            // A few ms above a healthy Redis round trip, far below a client's patience.
            timeout: Duration::from_millis(20),
            breaker: BreakerConfig::default(),
        }
    }
}

/// When the breaker opens and how it probes.
///
/// After `failure_threshold` consecutive failures (errors or timeouts) the
/// breaker opens: requests skip Redis and take the rule's failure mode at
/// once. After `open_for`, one request probes Redis; success closes the
/// breaker, failure opens it again.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::failure::BreakerConfig;
/// let cfg = BreakerConfig::default().failure_threshold(3).open_for(Duration::from_millis(500));
/// assert_eq!(cfg.get_failure_threshold(), 3);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub(crate) threshold: u32,
    pub(crate) open_for: Duration,
}

impl Default for BreakerConfig {
    /// Opens after 5 consecutive failures, probes after 1 s.
    fn default() -> Self {
        Self {
            threshold: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

impl BreakerConfig {
    /// Consecutive failures that open the breaker (at least 1).
    pub fn failure_threshold(mut self, n: u32) -> Self {
        self.threshold = n;
        self
    }

    /// How long the breaker stays open before probing.
    pub fn open_for(mut self, d: Duration) -> Self {
        self.open_for = d;
        self
    }

    /// The failure threshold (see [`failure_threshold`](Self::failure_threshold)).
    pub fn get_failure_threshold(&self) -> u32 {
        self.threshold
    }

    /// The open period (see [`open_for`](Self::open_for)).
    pub fn get_open_for(&self) -> Duration {
        self.open_for
    }
}
