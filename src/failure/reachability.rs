//! Whether the server answered lately, judged off the request runtime.
//!
//! A reply that is late because the gateway's own runtime is too busy to
//! read it is not a dead server, and treating it as one over-admits: Redis
//! already spent the unit, and the failure mode admits the request again.
//! So a call that outlives its timeout asks a pinger, a thread with its own
//! connection and its own runtime, whether the server still answers.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::Thread;
// Tokio's clock, so tests can pause it; outside a paused runtime it is the
// system's monotonic clock, which the pinger thread reads.
use tokio::time::Instant;

/// Starts the pinger thread, handing it a [`Heard`] to report to.
pub(crate) type StartPinger = Box<dyn FnOnce(Heard) -> std::io::Result<Thread> + Send>;

/// One server's (or cluster's) reachability. Cloned handles share it.
#[derive(Clone)]
pub(crate) struct Reachability(Arc<Shared>);

struct Shared {
    base: Instant,
    /// Micros since `base` of the latest reply or pong, plus one (0: never).
    heard: AtomicU64,
    /// Calls waiting past their timeout: the pinger pings while any are.
    armed: AtomicUsize,
    stopped: AtomicBool,
    pinger: Mutex<Pinger>,
}

enum Pinger {
    /// Started on the first late call, so a healthy gateway never pings.
    Idle(Option<StartPinger>),
    Running(Thread),
    /// No pinger (tests, or the thread could not start): replies alone count.
    None,
}

impl std::fmt::Debug for Reachability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reachability")
            .field("armed", &self.0.armed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Reachability {
    pub(crate) fn new(start: Option<StartPinger>) -> Self {
        Self(Arc::new(Shared {
            base: Instant::now(),
            heard: AtomicU64::new(0),
            armed: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            pinger: Mutex::new(start.map_or(Pinger::None, |s| Pinger::Idle(Some(s)))),
        }))
    }

    /// A reply arrived on the request path (an error reply too).
    pub(crate) fn heard(&self) {
        self.0.heard_at(Instant::now());
    }

    /// Whether anything was heard at or after `t`.
    pub(crate) fn heard_since(&self, t: Instant) -> bool {
        self.0.heard.load(Ordering::Relaxed) > self.0.micros(t)
    }

    /// Keeps the pinger pinging until the returned guard drops.
    pub(crate) fn arm(&self) -> Armed<'_> {
        self.0.armed.fetch_add(1, Ordering::Relaxed);
        let mut p = self.0.pinger.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *p {
            Pinger::Running(t) => t.unpark(),
            Pinger::Idle(start) => {
                let start = start.take().expect("started once");
                *p = match start(Heard(Arc::downgrade(&self.0))) {
                    Ok(t) => Pinger::Running(t),
                    Err(e) => {
                        tracing::warn!(target: crate::observe::TARGET, error = %e, "cannot start the redis pinger thread");
                        Pinger::None
                    }
                };
            }
            Pinger::None => {}
        }
        Armed(self)
    }

    /// Ends the pinger: the backend is gone.
    pub(crate) fn stop(&self) {
        self.0.stopped.store(true, Ordering::Relaxed);
        if let Pinger::Running(t) = &*self.0.pinger.lock().unwrap_or_else(PoisonError::into_inner) {
            t.unpark();
        }
    }
}

impl Shared {
    fn micros(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_micros() as u64
    }

    fn heard_at(&self, t: Instant) {
        self.heard.fetch_max(self.micros(t) + 1, Ordering::Relaxed);
    }
}

/// A late call's claim on the pinger.
pub(crate) struct Armed<'a>(&'a Reachability);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.0.armed.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pinger's handle: weak, so the thread ends when the backend is dropped.
pub(crate) struct Heard(Weak<Shared>);

impl Heard {
    /// `None`: the backend is gone, stop. `Some(false)`: nobody waits, park.
    pub(crate) fn wanted(&self) -> Option<bool> {
        let s = self.0.upgrade()?;
        if s.stopped.load(Ordering::Relaxed) {
            return None;
        }
        Some(s.armed.load(Ordering::Relaxed) > 0)
    }

    /// A pong came back.
    pub(crate) fn pong(&self) {
        if let Some(s) = self.0.upgrade() {
            s.heard_at(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn replies_count_as_heard_from_their_time_on() {
        let l = Reachability::new(None);
        let before = Instant::now();
        assert!(!l.heard_since(before));
        l.heard();
        assert!(l.heard_since(before));
        assert!(!l.heard_since(Instant::now() + Duration::from_millis(5)));
    }

    #[test]
    fn the_pinger_starts_on_the_first_late_call_and_reports() {
        let (tx, rx) = std::sync::mpsc::channel();
        let l = Reachability::new(Some(Box::new(move |heard: Heard| {
            tx.send(heard).unwrap();
            Ok(std::thread::current())
        })));
        let armed = l.arm();
        let heard = rx.try_recv().expect("started");
        assert_eq!(heard.wanted(), Some(true));
        let t = Instant::now();
        heard.pong();
        assert!(l.heard_since(t));
        drop(armed);
        assert_eq!(heard.wanted(), Some(false));
        let again = l.arm();
        assert!(rx.try_recv().is_err(), "started only once");
        drop(again);
        let clone = l.clone();
        clone.stop();
        assert_eq!(heard.wanted(), None, "a stopped backend's pinger ends");
        drop((clone, l));
        assert_eq!(heard.wanted(), None, "the backend is gone");
    }
}
