//! The decide-then-call machinery the rate and concurrency middlewares
//! share: decide on the request head without awaiting when possible (else
//! box the rest), call the readied inner service, add the rendered headers,
//! or answer with the refusal.

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
    pub(crate) fn call<X>(
        inner: &mut S,
        req: Request<ReqBody>,
        decide: impl FnOnce(&mut Parts) -> Result<Admission<G>, X>,
        suspend: impl FnOnce(Parts, X) -> Pending<G>,
    ) -> Self {
        let (mut parts, body) = req.into_parts();
        let state = match decide(&mut parts) {
            Ok(Admission::Go(headers, guard)) => State::Calling {
                fut: inner.call(Request::from_parts(parts, body)),
                headers,
                guard: Some(guard),
            },
            Ok(Admission::Stop(res)) => State::Refused { res: Some(res) },
            Err(x) => {
                // The readied service goes with the request; a clone stays,
                // as tower's docs prescribe.
                let clone = inner.clone();
                State::Deciding {
                    decide: suspend(parts, x),
                    inner: Some(std::mem::replace(inner, clone)),
                    body: Some(body),
                }
            }
        };
        Self { state }
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
