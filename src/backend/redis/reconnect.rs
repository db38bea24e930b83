//! A connection made in the background and remade on demand: a lazy
//! cluster connection, and the Sentinel master, which moves.
//!
//! Connecting runs in a task of its own, so a caller's timeout (a rule's
//! 20 ms) cannot cancel it halfway; callers wait for the one attempt in
//! flight. A failed attempt backs off (50 ms, doubling to 250 ms) before the
//! next, so a dead server costs one attempt per backoff, not one per call.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::RedisError;
use tokio::time::Instant;

use crate::util::instant::after;

const BACKOFF_MIN: Duration = Duration::from_millis(50);
// Low: a lookup costs a sentinel a few commands, and a promoted master
// should be found soon after the sentinels announce it.
const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// The most often a connection that may be stale is checked.
#[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
const RECHECK_EVERY: Duration = Duration::from_secs(1);

type Connect<T> = Arc<dyn Fn() -> BoxFuture<'static, Result<T, RedisError>> + Send + Sync>;
type Attempt<T> = Shared<BoxFuture<'static, Result<(T, u64), RedisError>>>;

/// One connection at a time, numbered, so a report about an old one
/// cannot drop its successor.
pub(super) struct Reconnecting<T: Clone> {
    connect: Connect<T>,
    state: Mutex<State<T>>,
}

struct State<T: Clone> {
    current: Option<(T, u64)>,
    attempt: Option<Attempt<T>>,
    /// No attempt before this (after a failure, or a recheck).
    next_try: Option<Instant>,
    backoff: Duration,
    made: u64,
}

impl<T: Clone + Send + Sync + 'static> Reconnecting<T> {
    pub(super) fn new(
        connect: impl Fn() -> BoxFuture<'static, Result<T, RedisError>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            connect: Arc::new(connect),
            state: Mutex::new(State {
                current: None,
                attempt: None,
                next_try: None,
                backoff: BACKOFF_MIN,
                made: 0,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection and its number; connects (or waits for the attempt
    /// in flight) when there is none. Within a backoff it fails at once.
    pub(super) async fn get(self: &Arc<Self>) -> Result<(T, u64), RedisError> {
        let attempt = {
            let mut state = self.state();
            if let Some(current) = &state.current {
                return Ok(current.clone());
            }
            match &state.attempt {
                Some(a) => a.clone(),
                None => {
                    if state.next_try.is_some_and(|t| Instant::now() < t) {
                        return Err(RedisError::from((
                            redis::ErrorKind::Io,
                            "no redis connection yet; the next attempt is backed off",
                        )));
                    }
                    self.start(&mut state)
                }
            }
        };
        attempt.await
    }

    /// Starts an attempt in a task of its own; its outcome updates the state.
    fn start(self: &Arc<Self>, state: &mut State<T>) -> Attempt<T> {
        let this = Arc::downgrade(self);
        let connect = (self.connect)();
        let task = tokio::spawn(async move {
            let made = connect.await;
            let Some(this) = this.upgrade() else {
                return made.map(|c| (c, 0));
            };
            let mut state = this.state();
            state.attempt = None;
            match made {
                Ok(conn) => {
                    state.made += 1;
                    let current = (conn, state.made);
                    state.current = Some(current.clone());
                    state.backoff = BACKOFF_MIN;
                    state.next_try = None;
                    Ok(current)
                }
                Err(e) => {
                    state.next_try = Some(after(Instant::now(), state.backoff));
                    state.backoff = (state.backoff * 2).min(BACKOFF_MAX);
                    Err(e)
                }
            }
        });
        let attempt = task
            .map(|joined| {
                joined.unwrap_or_else(|e| {
                    Err(RedisError::from(std::io::Error::other(format!(
                        "redis connect task failed: {e}"
                    ))))
                })
            })
            .boxed()
            .shared();
        state.attempt = Some(attempt.clone());
        attempt
    }

    // Only the sentinel master moves; a cluster connection follows its own.
    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    /// Connection `n` failed in a way that says it is gone: the next call
    /// connects anew.
    pub(super) fn forget(&self, n: u64) {
        let mut state = self.state();
        if state.current.as_ref().is_some_and(|(_, m)| *m == n) {
            state.current = None;
            state.next_try = None;
        }
    }

    #[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
    /// Connection `n` may be stale (a call on it was abandoned): connect
    /// anew in the background and keep using it meanwhile; at most once a
    /// second.
    pub(super) fn recheck(self: &Arc<Self>, n: u64) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut state = self.state();
        let now = Instant::now();
        if state.current.as_ref().is_none_or(|(_, m)| *m != n)
            || state.attempt.is_some()
            || state.next_try.is_some_and(|t| now < t)
        {
            return;
        }
        state.next_try = Some(after(now, RECHECK_EVERY));
        drop(self.start(&mut state));
    }
}

/// Reports a call on connection `n` that was dropped before it finished
/// (a rule's timeout) to [`Reconnecting::recheck`].
#[cfg_attr(not(feature = "redis-sentinel"), allow(dead_code))]
pub(super) struct Abandoned<'a, T: Clone + Send + Sync + 'static> {
    pub(super) on: &'a Arc<Reconnecting<T>>,
    pub(super) n: u64,
    pub(super) finished: bool,
}

impl<T: Clone + Send + Sync + 'static> Drop for Abandoned<'_, T> {
    fn drop(&mut self) {
        if !self.finished {
            self.on.recheck(self.n);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn counting(fail: bool) -> (Arc<Reconnecting<u32>>, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let r = Reconnecting::new(move || {
            let n = c.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if fail {
                    Err(RedisError::from((redis::ErrorKind::Io, "refused")))
                } else {
                    Ok(n)
                }
            }
            .boxed()
        });
        (r, calls)
    }

    #[tokio::test]
    async fn connects_once_and_again_only_after_forget() {
        let (r, calls) = counting(false);
        assert_eq!(r.get().await.unwrap(), (1, 1));
        assert_eq!(r.get().await.unwrap(), (1, 1));
        r.forget(0);
        assert_eq!(r.get().await.unwrap(), (1, 1), "a stale number is ignored");
        r.forget(1);
        assert_eq!(r.get().await.unwrap(), (2, 2));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_backs_off_before_the_next_attempt() {
        let (r, calls) = counting(true);
        assert!(r.get().await.is_err());
        assert!(r.get().await.is_err(), "within the backoff: no attempt");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::advance(BACKOFF_MIN).await;
        assert!(r.get().await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // Doubled: 50 ms later is still inside it.
        tokio::time::advance(BACKOFF_MIN).await;
        assert!(r.get().await.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_recheck_keeps_the_connection_until_the_new_one_is_made() {
        let (r, calls) = counting(false);
        assert_eq!(r.get().await.unwrap(), (1, 1));
        r.recheck(1);
        r.recheck(1);
        tokio::task::yield_now().await;
        assert_eq!(r.get().await.unwrap(), (2, 2));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "at most once a second");
        tokio::time::advance(RECHECK_EVERY).await;
        r.recheck(2);
        tokio::task::yield_now().await;
        assert_eq!(r.get().await.unwrap().1, 3);
    }
}
