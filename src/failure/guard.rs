//! The runtime side of failure handling (feature `redis`): the guarded
//! call, and the decision without Redis.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use futures_util::FutureExt;

use super::breaker::Admit;
use super::reported::ReportedBreaker;
use super::{BreakerStatus, FailureMode, LiveCount, Reachability};
use crate::observe::{self, Guarded};
use crate::policy::Cause;
use crate::policy::FailurePolicy;
use crate::util::instant::after;
use crate::{decision::Source, key::Key, quota::Quota};

/// How many timeouts a call may wait in all while the server keeps
/// answering: with the default 20 ms, 1 s.
pub(crate) const PATIENCE: u32 = 50;

/// A failed call's error, as the guard needs to see it.
pub(crate) trait CallError: fmt::Display {
    /// Nothing listens where the server was: it is down, not slow. (A
    /// dropped connection is not enough: servers close idle ones, and the
    /// client reconnects at once.)
    fn connection_refused(&self) -> bool;
}

/// A global rule's failure handling: the mode, the per-decision timeout,
/// the breaker, and the instance count the local fallback divides by. The
/// fallback's own counters belong to whoever limits: a rate rule keeps a
/// local store, a concurrency limit its slots.
pub(crate) struct Guard {
    rule: Arc<str>,
    mode: FailureMode,
    timeout: Duration,
    breaker: ReportedBreaker,
    instances: u32,
    /// The live gateway count, when the backend keeps one: it replaces
    /// `instances` once read.
    live: Option<Arc<LiveCount>>,
    /// Failure-mode decisions, logged at most once a second.
    failure_log: observe::Sampled,
    /// Which requests `RefusePercent` refuses.
    partial: super::partial::Partial,
}

impl FailureMode {
    /// The decision's source when this mode decides: a partial mode's
    /// admits are fail-open ones, its refusals fail-closed ones.
    pub(crate) fn source(self, allowed: bool) -> Source {
        match self {
            Self::FailOpen => Source::FailOpen,
            Self::FailClosed => Source::FailClosed,
            Self::LocalFallback => Source::Fallback,
            Self::RefusePercent(_) if allowed => Source::FailOpen,
            Self::RefusePercent(_) => Source::FailClosed,
        }
    }
}

impl Guard {
    pub(crate) fn new(
        rule: Arc<str>,
        policy: FailurePolicy,
        instances: u32,
        live: Option<Arc<LiveCount>>,
    ) -> Self {
        // A probe is lost once it has waited longer than any call may.
        let probe_deadline = policy
            .timeout
            .saturating_mul(PATIENCE + 1)
            .max(Duration::from_millis(50));
        observe::redis_timeout(&rule, policy.timeout);
        Self {
            breaker: ReportedBreaker::new(
                rule.clone(),
                Guarded::Redis,
                policy.breaker,
                probe_deadline,
            ),
            rule,
            mode: policy.mode,
            timeout: policy.timeout,
            instances,
            live,
            failure_log: Default::default(),
            partial: Default::default(),
        }
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

    /// One guarded Redis call, answered or failed within its timeout unless
    /// the server is heard to be alive. Half-way through the timeout a call
    /// still waiting arms the [`Reachability`] pinger, so by the timeout it is
    /// known whether the server answers at all: if nothing (no reply, no
    /// pong) was heard since arming, the call fails there. If the server
    /// answers others, the reply is queued behind them (or the runtime is too
    /// busy to read it), and the call keeps waiting, a timeout at a time, up
    /// to [`PATIENCE`] timeouts: failing it would hand a unit Redis may
    /// already have spent to the failure mode, and a gateway whose own
    /// runtime is saturated would trip its breaker on a healthy Redis. A
    /// refused connection (nothing listens) opens the breaker at once, so
    /// later calls don't each wait for it.
    ///
    /// The caller checks [`admit`](Self::admit) first, and pins the call
    /// where it stands: a future moved in here would be stored twice in
    /// this one (as the argument and as the pinned local), and copied.
    pub(crate) async fn call<T, E: CallError>(
        &self,
        reachability: &Reachability,
        fut: Pin<&mut impl Future<Output = Result<T, E>>>,
    ) -> Result<T, Cause> {
        let start = Instant::now();
        let outcome = wait(self.timeout, reachability, start, fut).await;
        self.counted(start, outcome)
    }

    /// What a call begun at `start` tells this rule's breaker and latency
    /// metric: its outcome (`Err`: it timed out, after that long), and the
    /// result the caller sees.
    pub(crate) fn counted<T, E: CallError>(
        &self,
        start: Instant,
        outcome: Result<Result<T, E>, Duration>,
    ) -> Result<T, Cause> {
        let took = match outcome {
            Err(took) => took,
            Ok(_) => start.elapsed(),
        };
        observe::backend_latency(&self.rule, "redis", took);
        match outcome {
            Ok(Ok(v)) => {
                self.breaker.success();
                Ok(v)
            }
            Ok(Err(e)) => {
                if e.connection_refused() {
                    self.breaker.trip(&e);
                }
                Err(Cause::Error(e.to_string()))
            }
            Err(took) => Err(Cause::Timeout(took)),
        }
    }

    /// The rule's timeout, which one call for several rules waits the
    /// shortest of.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The gateways a quota is shared by: the live count once read, never
    /// below the configured number (a floor, so that gateways of one
    /// process, which count once, keep the share they were given).
    fn instances(&self) -> u32 {
        self.live
            .as_ref()
            .and_then(|l| l.get())
            .map_or(self.instances, |n| n.max(self.instances))
    }

    /// This instance's share of `quota`.
    pub(crate) fn share(&self, quota: Quota) -> Quota {
        quota.divided_by(self.instances())
    }

    /// This instance's share of a limit of `n`, rounded up.
    pub(crate) fn local_share(&self, n: u32) -> u32 {
        n.div_ceil(self.instances().max(1))
    }

    /// The wait a fail-closed refusal asks for: until the breaker probes, or
    /// at least a second.
    pub(crate) fn closed_retry(&self) -> Duration {
        match self.breaker.open_remaining() {
            Some(wait) if !wait.is_zero() => wait,
            _ => self.timeout.max(Duration::from_secs(1)),
        }
    }

    /// Whether `RefusePercent(percent)` refuses this request (see
    /// `Partial`).
    pub(crate) fn partial_refuses(&self, percent: u8) -> bool {
        self.partial.refuses(percent)
    }

    /// A failed call that no failure mode decides (a refund, a charge after
    /// the response): the breaker counts it.
    pub(crate) fn failed(&self, cause: &Cause) {
        if !matches!(cause, Cause::CircuitOpen | Cause::Waited) {
            self.breaker.failure(cause);
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
        self.failed(&cause);
        let (out, allowed) = decide(self.mode);
        let mode = self.mode.as_str();
        observe::failure_mode(
            &self.rule,
            || key.fingerprint(),
            cause.kind(),
            &cause,
            mode,
            allowed,
            &self.failure_log,
        );
        (out, self.mode.source(allowed))
    }
}

/// Waits for a guarded call begun at `start` (see [`Guard::call`]): its
/// output, or `Err` with how long it waited when it timed out.
pub(crate) async fn wait<F: Future>(
    timeout: Duration,
    reachability: &Reachability,
    start: Instant,
    mut fut: Pin<&mut F>,
) -> Result<F::Output, Duration> {
    let give_up = after(start, timeout.saturating_mul(PATIENCE));
    let half = timeout / 2;
    let mut since = start;
    let mut deadline = after(start, half);
    let mut armed = None;
    loop {
        if let Ok(out) = tokio::time::timeout_at(deadline, &mut fut).await {
            return Ok(out);
        }
        // A timer can fire before the connection's reader, woken by the
        // same driver tick, has run: let it run once before judging.
        tokio::task::yield_now().await;
        if let Some(out) = (&mut fut).now_or_never() {
            return Ok(out);
        }
        let now = Instant::now();
        if armed.is_none() {
            armed = Some(reachability.arm());
            since = now;
            // A late timer still leaves the pinger half a timeout.
            deadline = after(start, timeout).max(after(now, half));
            continue;
        }
        if now >= give_up || !reachability.heard_since(since) {
            return Err(now - start);
        }
        since = now;
        deadline = after(now, timeout).min(give_up);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::BreakerState;
    use std::pin::pin;

    const TIMEOUT: Duration = Duration::from_millis(20);

    #[derive(Debug)]
    struct Failed {
        lost: bool,
    }

    impl fmt::Display for Failed {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(if self.lost {
                "connection reset"
            } else {
                "ERR script"
            })
        }
    }

    impl CallError for Failed {
        fn connection_refused(&self) -> bool {
            self.lost
        }
    }

    fn guard() -> Guard {
        let policy = FailurePolicy {
            timeout: TIMEOUT,
            ..FailurePolicy::default()
        };
        Guard::new("r".into(), policy, 4, None)
    }

    fn never() -> impl Future<Output = Result<(), Failed>> {
        std::future::pending()
    }

    /// Reports a reply or pong every 5 ms until dropped.
    fn alive(l: &Reachability) -> tokio::task::JoinHandle<()> {
        let l = l.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                l.heard();
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_fails_at_the_timeout() {
        let (g, l) = (guard(), Reachability::new(None));
        let Err(Cause::Timeout(waited)) = g.call(&l, pin!(never())).await else {
            panic!("a silent server must time out");
        };
        assert_eq!(waited, TIMEOUT, "the pinger was armed half-way");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_before_arming_is_no_sign_of_life_after_it() {
        let (g, l) = (guard(), Reachability::new(None));
        let heard_early = async {
            tokio::time::sleep(TIMEOUT / 4).await;
            l.heard();
            std::future::pending::<()>().await;
        };
        let never = pin!(never());
        tokio::select! {
            r = g.call(&l, never) => {
                let Err(Cause::Timeout(waited)) = r else { panic!("must time out") };
                assert_eq!(waited, TIMEOUT);
            }
            () = heard_early => unreachable!(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_reply_from_a_live_server_is_awaited_not_failed() {
        let (g, l) = (guard(), Reachability::new(None));
        let pings = alive(&l);
        let late = async {
            tokio::time::sleep(15 * TIMEOUT).await;
            Ok::<_, Failed>(7)
        };
        assert_eq!(g.call(&l, pin!(late)).await.unwrap(), 7);
        assert_eq!(g.breaker_status().state, BreakerState::Closed);
        pings.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn patience_bounds_the_wait_on_a_server_that_answers_others() {
        let (g, l) = (guard(), Reachability::new(None));
        let pings = alive(&l);
        let Err(Cause::Timeout(waited)) = g.call(&l, pin!(never())).await else {
            panic!("must give up");
        };
        assert_eq!(waited, TIMEOUT * PATIENCE);
        pings.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_connection_opens_the_breaker_at_once_an_error_reply_does_not() {
        let (g, l) = (guard(), Reachability::new(None));
        let reply = pin!(async { Err::<(), _>(Failed { lost: false }) });
        assert!(matches!(g.call(&l, reply).await, Err(Cause::Error(_))));
        assert_eq!(g.breaker_status().state, BreakerState::Closed);
        let reset = pin!(async { Err::<(), _>(Failed { lost: true }) });
        assert!(matches!(g.call(&l, reset).await, Err(Cause::Error(_))));
        let status = g.breaker_status();
        assert_eq!(status.state, BreakerState::Open);
        assert_eq!(status.reopens_in, Some(Duration::from_secs(1)));
        assert!(matches!(g.admit(), Admit::Skip(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_count_toward_the_breaker_and_the_mode_decides() {
        let g = guard();
        let key = Key::from("k");
        for i in 1..=5 {
            let (allowed, source) = g.fail_with(&key, Cause::Timeout(TIMEOUT), |mode| {
                assert_eq!(mode, FailureMode::LocalFallback);
                (true, true)
            });
            assert!(allowed);
            assert_eq!(source, Source::Fallback);
            let open = g.breaker_status().state == BreakerState::Open;
            assert_eq!(open, i == 5, "opens on the 5th consecutive failure");
        }
        assert_eq!(g.share(Quota::per_minute(100)).limit(), 25);
        assert_eq!(g.local_share(10), 3);
        assert_eq!(g.closed_retry(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_endless_timeout_is_no_overflow() {
        let policy = FailurePolicy {
            timeout: Duration::MAX,
            ..FailurePolicy::default()
        };
        let (g, l) = (
            Guard::new("r".into(), policy, 1, None),
            Reachability::new(None),
        );
        let ok = g.call(&l, pin!(async { Ok::<_, Failed>(1) })).await;
        assert_eq!(ok.unwrap(), 1);
    }
}
