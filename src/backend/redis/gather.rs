//! Several rules' rate calls on one Redis sent as one (`multi.lua`): the
//! calls made while a [`gathered`] future is polled are queued, then sent
//! per backend in one round trip and one script call, each caller getting
//! its own call's reply. How the rate-limit service decides a request's
//! descriptors together. A cluster's calls go alone: their keys hash to
//! slots of their own.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::oneshot;

use super::error::RedisBackendError;
use super::script::{Eval, multi};

/// What Redis gives back for one call.
type Returned = Result<redis::Value, RedisBackendError>;

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A queued call and where its reply goes.
type Queued = (Eval, oneshot::Sender<Returned>);

/// A backend, as the gatherer sends on it (a trait: the gatherer must not
/// depend on the backend that depends on it).
pub(super) trait Sends: Send + Sync {
    /// Sends `eval` now, alone.
    fn send(self: Arc<Self>, eval: Eval) -> Pin<Box<dyn Future<Output = Returned> + Send>>;
}

type Sender = Arc<dyn Sends>;

tokio::task_local! {
    static GATHER: Arc<Gather>;
}

/// The calls queued while the gathered future was last polled.
#[derive(Default)]
struct Gather {
    queued: Mutex<Vec<(Sender, Queued)>>,
}

/// Queues `eval` for `backend` when a [`gathered`] future is being polled
/// (the reply comes through the receiver); gives it back otherwise.
pub(super) fn queue(backend: &Sender, eval: Eval) -> Result<oneshot::Receiver<Returned>, Eval> {
    let mut eval = Some(eval);
    GATHER
        .try_with(|g| {
            let (tx, rx) = oneshot::channel();
            let call = (eval.take().expect("queued once"), tx);
            g.queued
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((backend.clone(), call));
            rx
        })
        .map_err(|_| eval.expect("not queued"))
}

pin_project_lite::pin_project! {
    /// See [`gathered`].
    pub(crate) struct Gathered<F> {
        #[pin]
        inner: F,
        gather: Arc<Gather>,
        calls: FuturesUnordered<Call>,
    }
}

/// `inner`, with the rate calls each of its polls makes sent together.
pub(crate) fn gathered<F: Future>(inner: F) -> Gathered<F> {
    Gathered {
        inner,
        gather: Arc::default(),
        calls: FuturesUnordered::new(),
    }
}

impl<F: Future> Future for Gathered<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        // Replies first: each reaches its caller before the callers are
        // polled, so that they finish in this poll rather than the next.
        while let Poll::Ready(Some(())) = this.calls.poll_next_unpin(cx) {}
        let polled = GATHER.sync_scope(this.gather.clone(), || this.inner.as_mut().poll(cx));
        if polled.is_ready() {
            return polled;
        }
        let queued = std::mem::take(
            &mut *this
                .gather
                .queued
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for call in by_backend(queued) {
            this.calls.push(call);
        }
        // A reply wakes the caller it answers, and so this task.
        while let Poll::Ready(Some(())) = this.calls.poll_next_unpin(cx) {}
        Poll::Pending
    }
}

/// One call per backend: a lone call as it is, several in `multi.lua`.
fn by_backend(queued: Vec<(Sender, Queued)>) -> Vec<Call> {
    let mut groups: Vec<(Sender, Vec<Queued>)> = Vec::new();
    for (backend, call) in queued {
        match groups.iter_mut().find(|(b, _)| Arc::ptr_eq(b, &backend)) {
            Some((_, calls)) => calls.push(call),
            None => groups.push((backend, vec![call])),
        }
    }
    groups
        .into_iter()
        .map(|(backend, mut calls)| -> Call {
            if calls.len() == 1 {
                let (eval, tx) = calls.pop().expect("one call");
                return Box::pin(async move {
                    let _ = tx.send(backend.send(eval).await);
                });
            }
            let multi = multi(calls.iter().map(|(eval, _)| eval));
            Box::pin(async move {
                let replies = backend
                    .send(multi)
                    .await
                    .and_then(|v| split(v, calls.len()));
                match replies {
                    Ok(replies) => {
                        for ((_, tx), reply) in calls.into_iter().zip(replies) {
                            let _ = tx.send(Ok(reply));
                        }
                    }
                    Err(e) => {
                        for (_, tx) in calls {
                            let _ = tx.send(Err(e.clone()));
                        }
                    }
                }
            })
        })
        .collect()
}

/// `multi.lua`'s reply as `calls` replies: one string, each call's
/// values separated by spaces, the calls by `;`.
fn split(reply: redis::Value, calls: usize) -> Result<Vec<redis::Value>, RedisBackendError> {
    let short = || {
        let e = (redis::ErrorKind::UnexpectedReturnType, "a reply per call");
        RedisBackendError::Redis(e.into())
    };
    let redis::Value::BulkString(text) = reply else {
        return Err(short());
    };
    let text = std::str::from_utf8(&text).map_err(|_| short())?;
    let replies = text
        .split(';')
        .map(|call| {
            let values = call
                .split_ascii_whitespace()
                .map(|v| integer(v).map(redis::Value::Int));
            values.collect::<Option<Vec<_>>>().map(redis::Value::Array)
        })
        .collect::<Option<Vec<_>>>()
        .filter(|r| r.len() == calls)
        .ok_or_else(short)?;
    Ok(replies)
}

/// A Lua number as Redis replies it: an integer, truncated.
fn integer(v: &str) -> Option<i64> {
    v.parse().ok().or_else(|| {
        v.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(|f| f as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_reply_splits_into_each_calls_integers() {
        let reply = redis::Value::BulkString(b"3 0 1000;-1 250 1000.7;".to_vec());
        let calls = split(reply, 3).unwrap();
        let ints = |v: &redis::Value| -> Vec<i64> {
            redis::FromRedisValue::from_redis_value(v.clone()).unwrap()
        };
        assert_eq!(ints(&calls[0]), [3, 0, 1000]);
        assert_eq!(ints(&calls[1]), [-1, 250, 1000]);
        assert!(ints(&calls[2]).is_empty());
        let short = redis::Value::BulkString(b"3 0 1000".to_vec());
        assert!(split(short, 2).is_err());
        let junk = redis::Value::BulkString(b"3 x 1000;1 2 3".to_vec());
        assert!(split(junk, 2).is_err());
    }
}
