use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Full;
use tower::Service;

use super::{Conclusion, Shared};
use crate::response::ResponseBody;
use crate::rule::chain::Verdict;

type Headers = crate::headers::Rendered;

pin_project_lite::pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody, S::Future>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, F> {
        Deciding {
            decide: BoxFuture<'static, (Parts, Verdict)>,
            inner: Option<S>,
            body: Option<ReqBody>,
            shared: Arc<Shared>,
            grpc: bool,
        },
        Calling {
            #[pin]
            fut: F,
            headers: Headers,
        },
        Refused {
            res: Option<Response<Full<Bytes>>>,
        },
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn calling(fut: S::Future, headers: Headers) -> Self {
        Self {
            state: State::Calling { fut, headers },
        }
    }

    pub(crate) fn refused(res: Response<Full<Bytes>>) -> Self {
        Self {
            state: State::Refused { res: Some(res) },
        }
    }

    pub(crate) fn deciding(
        decide: BoxFuture<'static, (Parts, Verdict)>,
        inner: S,
        body: ReqBody,
        shared: Arc<Shared>,
        grpc: bool,
    ) -> Self {
        Self {
            state: State::Deciding {
                decide,
                inner: Some(inner),
                body: Some(body),
                shared,
                grpc,
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Deciding {
                    decide,
                    inner,
                    body,
                    shared,
                    grpc,
                } => {
                    let (mut parts, verdict) = ready!(decide.as_mut().poll(cx));
                    let next = match shared.conclude(verdict, *grpc) {
                        Conclusion::Go(headers, decision) => {
                            parts.extensions.insert(decision);
                            let body = body.take().expect("polled after completion");
                            let mut svc = inner.take().expect("polled after completion");
                            let fut = svc.call(Request::from_parts(parts, body));
                            State::Calling { fut, headers }
                        }
                        Conclusion::Stop(res) => State::Refused { res: Some(res) },
                    };
                    state.set(next);
                }
                StateProj::Calling { fut, headers } => {
                    let mut res = ready!(fut.poll(cx))?;
                    crate::headers::apply(res.headers_mut(), std::mem::take(headers));
                    return Poll::Ready(Ok(res.map(ResponseBody::inner)));
                }
                StateProj::Refused { res } => {
                    let res = res.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(ResponseBody::refusal)));
                }
            }
        }
    }
}
