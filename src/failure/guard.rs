//! The runtime side of failure handling (feature `redis`): the guarded
//! call, and the decision without Redis.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use super::breaker::{Admit, CircuitBreaker};
use super::{BreakerStatus, FailureMode, FailurePolicy, Liveness};
use crate::{Key, Quota, Source, observe};

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
