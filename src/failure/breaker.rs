//! A circuit breaker: opened by `failure_threshold` consecutive failures
//! (or at once by a refused connection), it skips calls for `open_for`, then
//! lets one probe through. A dead backend (Redis, or the remote rate-limit
//! service of `rls::client`) then costs one timeout per probe instead of
//! one per request.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;
// Tokio's clock, which tests can pause (the system clock otherwise).
use tokio::time::Instant;

use super::BreakerState;
use crate::policy::BreakerConfig;
use crate::util::instant::after;

#[derive(Debug)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { since: Instant },
}

/// What a caller may do now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    Call,
    /// Call: the one probe of a half-open breaker (it was open until now).
    Probe,
    /// Skip the call; it could be tried again in this long (while a probe
    /// is out, `open_for`).
    Skip(Duration),
}

#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    cfg: BreakerConfig,
    /// A probe that never reports back (its future was dropped) must not
    /// keep the breaker half-open forever.
    probe_deadline: Duration,
    state: Mutex<State>,
}

// The rate-limit client uses part of it without the `redis` feature.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl CircuitBreaker {
    pub(crate) fn new(cfg: BreakerConfig, probe_deadline: Duration) -> Self {
        Self {
            cfg,
            probe_deadline,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    pub(crate) fn admit(&self) -> Admit {
        self.admit_at(Instant::now)
    }

    /// [`admit`](Self::admit) at the time `now` reads, read only when the
    /// breaker is not closed: a closed one, the common case, needs no clock.
    fn admit_at(&self, now: impl FnOnce() -> Instant) -> Admit {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let State::Closed { .. } = *s {
            return Admit::Call;
        }
        let now = now();
        match *s {
            State::Closed { .. } => Admit::Call,
            State::Open { until } if now >= until => {
                *s = State::HalfOpen { since: now };
                Admit::Probe
            }
            State::Open { until } => Admit::Skip(until - now),
            State::HalfOpen { since } if now.duration_since(since) > self.probe_deadline => {
                *s = State::HalfOpen { since: now };
                Admit::Call
            }
            State::HalfOpen { .. } => Admit::Skip(self.cfg.open_for),
        }
    }

    /// Records a success; returns true when it closed an open or
    /// half-open breaker.
    pub(crate) fn success(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let was_open = !matches!(*s, State::Closed { .. });
        *s = State::Closed { failures: 0 };
        was_open
    }

    /// Records a failure; returns true when this one opened the breaker.
    pub(crate) fn failure(&self) -> bool {
        self.failure_at(Instant::now())
    }

    /// Opens the breaker whatever the count: the connection is known lost.
    /// Returns true when this call opened it.
    pub(crate) fn trip(&self) -> bool {
        self.trip_at(Instant::now())
    }

    fn trip_at(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(*s, State::Open { .. }) {
            return false;
        }
        *s = State::Open {
            until: after(now, self.cfg.open_for),
        };
        true
    }

    fn failure_at(&self, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let failures = match *s {
            State::Closed { failures } => failures + 1,
            // A failed probe reopens at once.
            State::HalfOpen { .. } => u32::MAX,
            State::Open { .. } => return false,
        };
        if failures >= self.cfg.threshold {
            *s = State::Open {
                until: after(now, self.cfg.open_for),
            };
            true
        } else {
            *s = State::Closed { failures };
            false
        }
    }

    /// How long the breaker stays open, when it is.
    pub(crate) fn open_remaining(&self) -> Option<Duration> {
        self.status().1
    }

    /// The state and, while open, the time left until the next probe.
    pub(crate) fn status(&self) -> (BreakerState, Option<Duration>) {
        self.status_at(Instant::now())
    }

    fn status_at(&self, now: Instant) -> (BreakerState, Option<Duration>) {
        match *self.state.lock().unwrap_or_else(PoisonError::into_inner) {
            State::Closed { .. } => (BreakerState::Closed, None),
            State::Open { until } => (
                BreakerState::Open,
                Some(until.saturating_duration_since(now)),
            ),
            State::HalfOpen { .. } => (BreakerState::HalfOpen, None),
        }
    }
}

#[cfg(all(test, feature = "redis"))]
mod tests {
    use super::*;

    fn breaker() -> CircuitBreaker {
        let cfg = BreakerConfig::default()
            .failure_threshold(3)
            .open_for(Duration::from_secs(1));
        CircuitBreaker::new(cfg, Duration::from_millis(100))
    }

    #[test]
    fn opens_after_threshold_and_a_success_resets_the_count() {
        let b = breaker();
        let t = Instant::now();
        assert!(!b.failure_at(t));
        assert!(!b.failure_at(t));
        b.success();
        assert!(!b.failure_at(t));
        assert!(!b.failure_at(t));
        assert!(b.failure_at(t));
        assert_eq!(b.status().0, BreakerState::Open);
        assert_eq!(
            b.admit_at(|| t + Duration::from_millis(400)),
            Admit::Skip(Duration::from_millis(600))
        );
    }

    #[test]
    fn half_open_lets_one_probe_through() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.failure_at(t);
        }
        let later = t + Duration::from_secs(1);
        assert_eq!(b.admit_at(|| later), Admit::Probe);
        assert_eq!(b.status().0, BreakerState::HalfOpen);
        assert!(matches!(b.admit_at(|| later), Admit::Skip(_)));
        // A failed probe reopens immediately.
        assert!(b.failure_at(later));
        assert!(matches!(
            b.admit_at(|| later + Duration::from_millis(10)),
            Admit::Skip(_)
        ));
        // The next probe succeeds and closes it.
        assert_eq!(b.admit_at(|| later + Duration::from_secs(1)), Admit::Probe);
        b.success();
        assert_eq!(b.status().0, BreakerState::Closed);
        assert_eq!(b.admit_at(|| later + Duration::from_secs(1)), Admit::Call);
    }

    #[test]
    fn a_lost_connection_trips_it_at_once() {
        let b = breaker();
        let t = Instant::now();
        assert!(b.trip_at(t));
        assert!(!b.trip_at(t), "already open");
        assert_eq!(
            b.status_at(t + Duration::from_millis(100)),
            (BreakerState::Open, Some(Duration::from_millis(900)))
        );
        assert_eq!(
            b.admit_at(|| t + Duration::from_millis(250)),
            Admit::Skip(Duration::from_millis(750))
        );
        assert_eq!(b.admit_at(|| t + Duration::from_secs(1)), Admit::Probe);
    }

    #[test]
    fn a_lost_probe_does_not_wedge_the_breaker() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.failure_at(t);
        }
        let probe = t + Duration::from_secs(1);
        assert_eq!(b.admit_at(|| probe), Admit::Probe);
        // The probe's future was dropped: after the deadline another caller probes.
        assert!(matches!(
            b.admit_at(|| probe + Duration::from_millis(50)),
            Admit::Skip(_)
        ));
        assert_eq!(
            b.admit_at(|| probe + Duration::from_millis(150)),
            Admit::Call
        );
    }
}
