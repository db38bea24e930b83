//! What a global rule does when Redis fails: fail open, fail closed, or
//! fall back to a local share of the quota, under a timeout and a circuit
//! breaker. Every such decision is a `tracing` warning and a metric,
//! because a limiter that fails open silently isn't a limiter.

mod breaker;
mod liveness;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

pub(crate) use breaker::{Admit, CircuitBreaker};
pub use breaker::{BreakerConfig, BreakerState, BreakerStatus};
pub(crate) use liveness::{Heard, Liveness};

use crate::{Key, Quota, Source, observe};

/// What a global rule decides when Redis errors, times out, or its circuit
/// breaker is open.
///
/// | mode | decision | use it when |
/// |---|---|---|
/// | `FailOpen` | allow; the rule's headers are left out | availability beats the limit (read traffic) |
/// | `FailClosed` | 429 with `Retry-After` (never 503) | the limit protects something that must not be overrun |
/// | `LocalFallback` (default) | this instance's share: the quota divided by [`RateLimitBuilder::instances`](crate::RateLimitBuilder::instances), on `governor` | most APIs: still limited, a little looser or tighter |
///
/// ```
/// use keyed_rate_limit::failure::FailureMode;
/// assert_eq!(FailureMode::default(), FailureMode::LocalFallback);
/// assert_eq!(FailureMode::FailClosed.as_str(), "fail_closed");
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
}

impl FailureMode {
    /// A short, stable name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::LocalFallback => "local_fallback",
        }
    }

    fn source(self) -> Source {
        match self {
            Self::FailOpen => Source::FailOpen,
            Self::FailClosed => Source::FailClosed,
            Self::LocalFallback => Source::Fallback,
        }
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a global rule survives a failing Redis: the mode, the time one
/// decision may wait for Redis, and the circuit breaker.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::failure::{FailureMode, FailurePolicy};
///
/// let p = FailurePolicy::default();
/// assert_eq!(p.mode, FailureMode::LocalFallback);
/// assert_eq!(p.timeout, Duration::from_millis(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailurePolicy {
    /// What to decide without Redis.
    pub mode: FailureMode,
    /// How long one decision waits for Redis (default 20 ms).
    pub timeout: Duration,
    /// When to stop asking Redis, and when to try again.
    pub breaker: BreakerConfig,
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

/// Why Redis could not decide.
#[derive(Debug)]
pub(crate) enum Cause {
    Timeout(Duration),
    Error(String),
    CircuitOpen,
}

impl Cause {
    fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Error(_) => "error",
            Self::CircuitOpen => "circuit_open",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "no answer within {d:?}"),
            Self::Error(e) => f.write_str(e),
            Self::CircuitOpen => f.write_str("circuit breaker open"),
        }
    }
}

/// How many timeouts a call may wait in all while the server keeps
/// answering: with the default 20 ms, 1 s.
pub(crate) const PATIENCE: u32 = 50;

/// A failed call's error, as the guard needs to see it.
pub(crate) trait CallError: fmt::Display {
    /// The connection is gone (refused, reset, dropped): no reply will come.
    fn connection_lost(&self) -> bool;
}

/// A global rule's failure handling: the mode, the per-decision timeout,
/// the breaker, and the instance count the local fallback divides by. The
/// fallback's own counters belong to whoever limits: a rate rule keeps a
/// local store, a concurrency limit its slots.
pub(crate) struct Guard {
    rule: Arc<str>,
    mode: FailureMode,
    timeout: Duration,
    breaker: CircuitBreaker,
    instances: u32,
}

impl Guard {
    pub(crate) fn new(rule: Arc<str>, policy: FailurePolicy, instances: u32) -> Self {
        // A probe is lost once its own timeout has long passed.
        let probe_deadline = policy
            .timeout
            .saturating_mul(4)
            .max(Duration::from_millis(50));
        Self {
            rule,
            mode: policy.mode,
            timeout: policy.timeout,
            breaker: CircuitBreaker::new(policy.breaker, probe_deadline),
            instances,
        }
    }

    fn breaker_opened_event(&self, cause: &dyn fmt::Display) {
        observe::breaker_opened(&self.rule, cause);
    }

    pub(crate) fn admit(&self) -> Admit {
        self.breaker.admit()
    }

    pub(crate) fn breaker_status(&self) -> BreakerStatus {
        let (state, reopens_in) = self.breaker.status();
        BreakerStatus {
            rule: self.rule.clone(),
            state,
            reopens_in,
        }
    }

    /// One guarded Redis call. The timeout ends waiting only when the server
    /// is silent: a call that outlives it arms the [`Liveness`] pinger, and
    /// keeps waiting while replies or pongs show the server alive (its reply
    /// is queued behind others, or the runtime is too busy to read it), up
    /// to [`PATIENCE`] timeouts. Failing it instead would hand a unit Redis
    /// may already have spent to the failure mode, admitting it twice. With
    /// nothing heard for a timeout after arming, the call fails. A lost
    /// connection (refused, reset) opens the breaker at once, so later calls
    /// don't each wait for it.
    ///
    /// The caller checks [`admit`](Self::admit) first.
    pub(crate) async fn call<T, E: CallError>(
        &self,
        liveness: &Liveness,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Cause> {
        let mut fut = std::pin::pin!(fut);
        let start = Instant::now();
        let give_up = start + self.timeout.saturating_mul(PATIENCE);
        let mut since = start;
        let mut deadline = start + self.timeout;
        let mut armed = None;
        let outcome = loop {
            if let Ok(out) = tokio::time::timeout_at(deadline.into(), &mut fut).await {
                break out;
            }
            // A timer can fire before the connection's reader, woken by the
            // same driver tick, has run: let it run once before judging.
            tokio::task::yield_now().await;
            if let Some(out) = (&mut fut).now_or_never() {
                break out;
            }
            let now = Instant::now();
            let alive = liveness.heard_since(since);
            if now >= give_up || (!alive && armed.is_some()) {
                return Err(Cause::Timeout(now - start));
            }
            armed.get_or_insert_with(|| liveness.arm());
            since = now;
            deadline = (now + self.timeout).min(give_up);
        };
        drop(armed);
        match outcome {
            Ok(v) => {
                self.breaker.success();
                Ok(v)
            }
            Err(e) => {
                if e.connection_lost() && self.breaker.trip() {
                    self.breaker_opened_event(&e);
                }
                Err(Cause::Error(e.to_string()))
            }
        }
    }

    /// The wait a fail-closed refusal asks for: until the breaker probes, or
    /// at least a second.
    /// This instance's share of `quota`.
    pub(crate) fn share(&self, quota: Quota) -> Quota {
        quota.divided_by(self.instances)
    }

    /// This instance's share of a limit of `n`, rounded up.
    pub(crate) fn local_share(&self, n: u32) -> u32 {
        n.div_ceil(self.instances.max(1))
    }

    pub(crate) fn closed_retry(&self) -> Duration {
        match self.breaker.open_remaining() {
            Some(wait) if !wait.is_zero() => wait,
            _ => self.timeout.max(Duration::from_secs(1)),
        }
    }

    /// What every decision without Redis shares, whatever it limits: the
    /// breaker counts the failure, and a warning and a metric say which mode
    /// decided. `decide` returns its result and whether it admits.
    pub(crate) fn fail_with<T>(
        &self,
        key: &Key,
        cause: Cause,
        decide: impl FnOnce(FailureMode) -> (T, bool),
    ) -> (T, Source) {
        if !matches!(cause, Cause::CircuitOpen) && self.breaker.failure() {
            self.breaker_opened_event(&cause);
        }
        let (out, allowed) = decide(self.mode);
        let mode = self.mode.as_str();
        observe::failure_mode(&self.rule, key, cause.kind(), &cause, mode, allowed);
        (out, self.mode.source())
    }
}
