//! A circuit breaker that reports what it does (`observe`): its state as
//! `rate_limit_breaker_state`, each outage's opening and closing as events
//! and counters, failed probes as counted (and at most once a minute
//! logged) events. A global rule's guard and the rate-limit client each
//! hold one.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::BreakerState;
use super::breaker::{Admit, CircuitBreaker};
use crate::observe::{self, Guarded};
use crate::policy::BreakerConfig;
use crate::util::throttle::Throttle;

pub(crate) struct ReportedBreaker {
    /// The `rule` label of its reports.
    name: Arc<str>,
    guarded: Guarded,
    breaker: CircuitBreaker,
    /// When the outage under way began, so that it is reported once when
    /// it begins and once when it ends.
    outage: Mutex<Option<Instant>>,
    /// Failed probes are logged at most once a minute.
    probe_log: Throttle,
}

impl ReportedBreaker {
    pub(crate) fn new(
        name: Arc<str>,
        guarded: Guarded,
        cfg: BreakerConfig,
        probe_deadline: Duration,
    ) -> Self {
        // A dashboard shows the breaker from the start, not from its first change.
        observe::breaker_state(&name, 0);
        Self {
            name,
            guarded,
            breaker: CircuitBreaker::new(cfg, probe_deadline),
            outage: Mutex::new(None),
            probe_log: Throttle::default(),
        }
    }

    pub(crate) fn admit(&self) -> Admit {
        let admit = self.breaker.admit();
        if admit == Admit::Probe {
            observe::breaker_state(&self.name, 2);
        }
        admit
    }

    /// A call answered.
    pub(crate) fn success(&self) {
        if self.breaker.success() {
            let began = self
                .outage
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            match began {
                Some(began) => observe::breaker_closed(&self.name, self.guarded, began.elapsed()),
                None => observe::breaker_state(&self.name, 0),
            }
        }
    }

    /// A call failed for `cause`.
    pub(crate) fn failure(&self, cause: &dyn fmt::Display) {
        if self.breaker.failure() {
            self.opened(cause);
        }
    }

    /// Nothing listens where the backend was: open at once.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn trip(&self, cause: &dyn fmt::Display) {
        if self.breaker.trip() {
            self.opened(cause);
        }
    }

    fn opened(&self, cause: &dyn fmt::Display) {
        let now = Instant::now();
        let mut outage = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        let first = outage.is_none();
        let began = *outage.get_or_insert(now);
        drop(outage);
        let log = !first && self.probe_log.ready(Duration::from_secs(60));
        observe::breaker_opened(&self.name, self.guarded, cause, (first, log), now - began);
    }

    pub(crate) fn open_remaining(&self) -> Option<Duration> {
        self.breaker.open_remaining()
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn status(&self) -> (BreakerState, Option<Duration>) {
        self.breaker.status()
    }
}
