//! The decide-then-call machinery the rate, concurrency and bandwidth
//! middlewares share: decide on the request head without awaiting when
//! possible (else box the rest), call the readied inner service, add the
//! rendered headers, or answer with the refusal.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use tower::Service;

use crate::headers::Rendered;
use crate::response::RefusalBody;

/// What a middleware decided for a request.
pub(crate) enum Admission<G> {
    /// Call the service, add these headers, and hold `G` (e.g. a
    /// concurrency permit) until the response is ready.
    Go(Rendered, G),
    /// Answer with this instead.
    Stop(Response<Bytes>),
}

/// A decision that has to await (an async key, a Redis call).
pub(crate) type Pending<G> = BoxFuture<'static, (Parts, Admission<G>)>;

pin_project_lite::pin_project! {
    pub(crate) struct Gate<S, ReqBody, G>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future, G>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, F, G> {
        Deciding {
            decide: Pending<G>,
            inner: Option<S>,
            body: Option<ReqBody>,
        },
        Calling {
            #[pin]
            fut: F,
            headers: Rendered,
            guard: Option<G>,
        },
        Refused {
            res: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqBody, G> Gate<S, ReqBody, G>
where
    S: Service<Request<ReqBody>> + Clone,
{
    /// Starts `req` through `inner`, which `poll_ready` readied. `decide`
    /// decides on the head in place when it can; otherwise it returns what
    /// it has so far, and `suspend` turns that and the head into the future
    /// that decides. The head is only moved when it has to go with a future.
    // Inlined, and each arm builds `Self` as it returns: the request head
    // and the inner future are then written where they end up, not moved
    // there through temporaries.
    #[inline(always)]
    pub(crate) fn call<X>(
        inner: &mut S,
        req: Request<ReqBody>,
        decide: impl FnOnce(&mut Parts) -> Result<Admission<G>, X>,
        suspend: impl FnOnce(Parts, X) -> Pending<G>,
    ) -> Self {
        let (mut parts, body) = req.into_parts();
        match decide(&mut parts) {
            Ok(Admission::Go(headers, guard)) => Self {
                state: State::Calling {
                    fut: inner.call(Request::from_parts(parts, body)),
                    headers,
                    guard: Some(guard),
                },
            },
            Ok(Admission::Stop(res)) => Self {
                state: State::Refused { res: Some(res) },
            },
            Err(x) => {
                // The readied service goes with the request; a clone stays,
                // as tower's docs prescribe.
                let clone = inner.clone();
                Self {
                    state: State::Deciding {
                        decide: suspend(parts, x),
                        inner: Some(std::mem::replace(inner, clone)),
                        body: Some(body),
                    },
                }
            }
        }
    }
}

impl<S, ReqBody, ResBody, G> Future for Gate<S, ReqBody, G>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: RefusalBody,
{
    /// The response, and the guard when the service was called.
    type Output = Result<(Response<ResBody>, Option<G>), S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding {
                    decide,
                    inner,
                    body,
                } => {
                    let (parts, admission) = ready!(decide.as_mut().poll(cx));
                    let next = match admission {
                        Admission::Go(headers, guard) => {
                            let body = body.take().expect("polled after completion");
                            let mut svc = inner.take().expect("polled after completion");
                            State::Calling {
                                fut: svc.call(Request::from_parts(parts, body)),
                                headers,
                                guard: Some(guard),
                            }
                        }
                        Admission::Stop(res) => State::Refused { res: Some(res) },
                    };
                    state.set(next);
                }
                StateProj::Calling {
                    fut,
                    headers,
                    guard,
                } => {
                    let mut res = ready!(fut.poll(cx))?;
                    crate::headers::apply(res.headers_mut(), headers);
                    return Poll::Ready(Ok((res, guard.take())));
                }
                StateProj::Refused { res } => {
                    let res = res.take().expect("polled after completion");
                    return Poll::Ready(Ok((res.map(ResBody::from_refusal), None)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::task::Waker;

    use http::{HeaderValue, StatusCode};
    use http_body_util::{BodyExt, Full};
    use tokio::sync::oneshot;
    use tower::{ServiceExt, service_fn};

    use super::*;
    use crate::headers::{RATELIMIT, X_RATELIMIT_LIMIT};

    type Res = Response<Full<Bytes>>;
    type Req = Request<&'static str>;

    /// Set by a decision; the inner service echoes it in `x-tag`.
    #[derive(Clone)]
    struct Tag(&'static str);

    fn request() -> Req {
        Request::builder().uri("/x").body("hello").unwrap()
    }

    /// Echoes the body, counts calls, and sets its own rate-limit headers.
    fn echo(
        calls: Arc<AtomicUsize>,
    ) -> impl Service<Req, Response = Res, Error = Infallible> + Clone {
        service_fn(move |req: Req| {
            calls.fetch_add(1, Ordering::SeqCst);
            let mut res = Response::builder()
                .header(RATELIMIT, "\"inner\";r=1;t=1")
                .header(X_RATELIMIT_LIMIT, "99");
            if let Some(Tag(t)) = req.extensions().get::<Tag>() {
                res = res.header("x-tag", *t);
            }
            let res = res.body(Full::new(Bytes::from(*req.body()))).unwrap();
            async move { Ok::<_, Infallible>(res) }
        })
    }

    fn refusal() -> Response<Bytes> {
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "3")
            .body(Bytes::from_static(b"slow down"))
            .unwrap()
    }

    fn headers() -> Rendered {
        let mut h = Rendered::new();
        h.push((RATELIMIT, HeaderValue::from_static("\"api\";r=9;t=6")));
        h.push((X_RATELIMIT_LIMIT, HeaderValue::from_static("10")));
        h
    }

    /// A gate whose decision is ready at once.
    fn decided<S, G>(svc: &mut S, admission: Admission<G>) -> Gate<S, &'static str, G>
    where
        S: Service<Req> + Clone,
    {
        Gate::call(
            svc,
            request(),
            |_| Ok::<_, Infallible>(admission),
            |_, never| match never {},
        )
    }

    /// A gate whose decision arrives on `rx`; it tags the head on the way.
    fn suspended<S, G>(svc: &mut S, rx: oneshot::Receiver<Admission<G>>) -> Gate<S, &'static str, G>
    where
        S: Service<Req> + Clone,
        G: Send + 'static,
    {
        Gate::call(
            svc,
            request(),
            |_| Err(rx),
            |mut parts, rx| {
                Box::pin(async move {
                    parts.extensions.insert(Tag("suspended"));
                    (parts, rx.await.expect("decision sent"))
                })
            },
        )
    }

    async fn body(res: Res) -> Bytes {
        res.into_body().collect().await.unwrap().to_bytes()
    }

    fn values(res: &Res, name: &http::HeaderName) -> Vec<String> {
        res.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    /// Whether `gate` is still pending after one poll.
    fn pending<F: Future>(gate: Pin<&mut F>) -> bool {
        gate.poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
    }

    #[tokio::test]
    async fn a_stop_answers_without_calling_the_service() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut svc = echo(calls.clone());
        let (res, guard) = decided::<_, u8>(&mut svc, Admission::Stop(refusal()))
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(guard.is_none());
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "3");
        assert!(res.headers().get(RATELIMIT).is_none());
        assert_eq!(body(res).await, "slow down");
    }

    #[tokio::test]
    async fn a_go_calls_the_service_and_adds_the_headers() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut svc = echo(calls.clone());
        let (res, guard) = decided(&mut svc, Admission::Go(headers(), 7u8))
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(guard, Some(7));
        assert_eq!(res.status(), StatusCode::OK);
        // List headers join the inner service's; `x-` ones replace them.
        assert_eq!(
            values(&res, &RATELIMIT),
            ["\"inner\";r=1;t=1", "\"api\";r=9;t=6"]
        );
        assert_eq!(values(&res, &X_RATELIMIT_LIMIT), ["10"]);
        assert_eq!(body(res).await, "hello");
    }

    #[tokio::test]
    async fn the_decision_may_edit_the_head_the_service_sees() {
        let mut svc = echo(Arc::default());
        let gate = Gate::call(
            &mut svc,
            request(),
            |parts| {
                parts.extensions.insert(Tag("decided"));
                Ok::<_, Infallible>(Admission::Go(Rendered::new(), ()))
            },
            |_, never| match never {},
        );
        let (res, _) = gate.await.unwrap();
        assert_eq!(res.headers()["x-tag"], "decided");
    }

    #[tokio::test]
    async fn a_service_error_passes_through() {
        let mut svc = service_fn(|_: Req| async { Err::<Res, _>("boom") });
        let out = decided(&mut svc, Admission::Go(headers(), ())).await;
        assert_eq!(out.err(), Some("boom"));
    }

    #[tokio::test]
    async fn a_suspended_go_calls_the_service_once_decided() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut svc = echo(calls.clone());
        let (tx, rx) = oneshot::channel();
        let mut gate = std::pin::pin!(suspended(&mut svc, rx));
        assert!(pending(gate.as_mut()));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let _ = tx.send(Admission::Go(headers(), 3u8));
        let (res, guard) = gate.await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(guard, Some(3));
        // The head went through the pending decision to the service.
        assert_eq!(res.headers()["x-tag"], "suspended");
        assert_eq!(values(&res, &X_RATELIMIT_LIMIT), ["10"]);
        assert_eq!(body(res).await, "hello");
    }

    #[tokio::test]
    async fn a_suspended_stop_answers_without_calling_the_service() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut svc = echo(calls.clone());
        let (tx, rx) = oneshot::channel::<Admission<u8>>();
        let mut gate = std::pin::pin!(suspended(&mut svc, rx));
        assert!(pending(gate.as_mut()));
        let _ = tx.send(Admission::Stop(refusal()));
        let (res, guard) = gate.await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        assert!(guard.is_none());
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(body(res).await, "slow down");
    }

    /// What happened to every copy of a [`Counting`] service, by copy id.
    #[derive(Default)]
    struct Log {
        readied: Vec<usize>,
        called: Vec<usize>,
        copies: usize,
    }

    /// A service that must be readied before each call; a clone is a new,
    /// unready copy.
    struct Counting {
        id: usize,
        ready: bool,
        log: Arc<Mutex<Log>>,
    }

    impl Counting {
        fn new() -> (Self, Arc<Mutex<Log>>) {
            let log = Arc::new(Mutex::new(Log {
                copies: 1,
                ..Log::default()
            }));
            let svc = Self {
                id: 0,
                ready: false,
                log: log.clone(),
            };
            (svc, log)
        }
    }

    impl Clone for Counting {
        fn clone(&self) -> Self {
            let mut log = self.log.lock().unwrap();
            log.copies += 1;
            Self {
                id: log.copies - 1,
                ready: false,
                log: self.log.clone(),
            }
        }
    }

    impl Service<Req> for Counting {
        type Response = Res;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Res, Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            self.ready = true;
            self.log.lock().unwrap().readied.push(self.id);
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Req) -> Self::Future {
            assert!(self.ready, "copy {} called without poll_ready", self.id);
            self.ready = false;
            self.log.lock().unwrap().called.push(self.id);
            std::future::ready(Ok(Response::new(Full::new(Bytes::new()))))
        }
    }

    #[tokio::test]
    async fn a_ready_decision_calls_the_readied_service_in_place() {
        let (mut svc, log) = Counting::new();
        svc.ready().await.unwrap();
        let gate = decided(&mut svc, Admission::Go(Rendered::new(), ()));
        // Called inside `call`, before the future is polled.
        assert_eq!(log.lock().unwrap().called, [0]);
        gate.await.unwrap();
        assert_eq!((svc.id, svc.ready), (0, false));
        assert_eq!(log.lock().unwrap().copies, 1, "no clone");
    }

    #[tokio::test]
    async fn a_ready_stop_keeps_the_service_readied() {
        let (mut svc, log) = Counting::new();
        svc.ready().await.unwrap();
        decided::<_, ()>(&mut svc, Admission::Stop(refusal()))
            .await
            .unwrap();
        assert_eq!((svc.id, svc.ready), (0, true));
        // So the next request may go without another poll_ready.
        decided(&mut svc, Admission::Go(Rendered::new(), ()))
            .await
            .unwrap();
        let log = log.lock().unwrap();
        assert_eq!(
            (&*log.readied, &*log.called, log.copies),
            (&[0][..], &[0][..], 1)
        );
    }

    #[tokio::test]
    async fn a_suspended_decision_takes_the_readied_service_and_leaves_a_clone() {
        let (mut svc, log) = Counting::new();
        svc.ready().await.unwrap();
        let (tx, rx) = oneshot::channel();
        let gate = suspended(&mut svc, rx);
        // The clone stays, unready: the caller must poll_ready it again.
        assert_eq!((svc.id, svc.ready), (1, false));
        assert!(log.lock().unwrap().called.is_empty());
        let _ = tx.send(Admission::Go(Rendered::new(), ()));
        gate.await.unwrap();
        assert_eq!(
            log.lock().unwrap().called,
            [0],
            "the readied copy was called"
        );
        svc.ready().await.unwrap();
        decided(&mut svc, Admission::Go(Rendered::new(), ()))
            .await
            .unwrap();
        let log = log.lock().unwrap();
        assert_eq!((&*log.readied, &*log.called), (&[0, 1][..], &[0, 1][..]));
        assert_eq!(log.copies, 2);
    }

    #[tokio::test]
    async fn a_suspended_stop_drops_the_readied_service_uncalled() {
        let (mut svc, log) = Counting::new();
        svc.ready().await.unwrap();
        let (tx, rx) = oneshot::channel::<Admission<()>>();
        let gate = suspended(&mut svc, rx);
        let _ = tx.send(Admission::Stop(refusal()));
        let (res, _) = gate.await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!((svc.id, svc.ready), (1, false));
        assert!(log.lock().unwrap().called.is_empty());
    }
}
