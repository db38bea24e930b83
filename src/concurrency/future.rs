use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Full;
use tower::Service;

use super::backend::Permit;
use super::body::ResponseBody;
use super::{Admission, Headers};

pin_project_lite::pin_project! {
    /// Response future of [`ConcurrencyLimitService`](super::ConcurrencyLimitService).
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
        // An async key extractor or Redis is still deciding.
        Admitting {
            admit: BoxFuture<'static, (Parts, Admission)>,
            inner: Option<S>,
            body: Option<ReqBody>,
        },
        Calling {
            #[pin]
            fut: F,
            headers: Headers,
            // Held while the service runs; moves into the body after.
            permit: Option<Permit>,
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
    pub(crate) fn calling(fut: S::Future, headers: Headers, permit: Option<Permit>) -> Self {
        Self {
            state: State::Calling {
                fut,
                headers,
                permit,
            },
        }
    }

    pub(crate) fn refused(res: Response<Full<Bytes>>) -> Self {
        Self {
            state: State::Refused { res: Some(res) },
        }
    }

    pub(crate) fn admitting(
        admit: BoxFuture<'static, (Parts, Admission)>,
        inner: S,
        body: ReqBody,
    ) -> Self {
        Self {
            state: State::Admitting {
                admit,
                inner: Some(inner),
                body: Some(body),
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
                StateProj::Admitting { admit, inner, body } => {
                    let (parts, admission) = ready!(admit.as_mut().poll(cx));
                    let next = match admission {
                        Admission::Go(headers, permit) => {
                            let body = body.take().expect("polled after completion");
                            let mut svc = inner.take().expect("polled after completion");
                            let fut = svc.call(Request::from_parts(parts, body));
                            State::Calling {
                                fut,
                                headers,
                                permit,
                            }
                        }
                        Admission::Stop(res) => State::Refused { res: Some(res) },
                    };
                    state.set(next);
                }
                StateProj::Calling {
                    fut,
                    headers,
                    permit,
                } => {
                    let mut res = ready!(fut.poll(cx))?;
                    crate::headers::apply(res.headers_mut(), std::mem::take(headers));
                    let permit = permit.take();
                    return Poll::Ready(Ok(res.map(|b| {
                        ResponseBody::new(crate::response::ResponseBody::inner(b), permit)
                    })));
                }
                StateProj::Refused { res } => {
                    let res = res.take().expect("polled after completion");
                    return Poll::Ready(Ok(res.map(|b| {
                        ResponseBody::new(crate::response::ResponseBody::refusal(b), None)
                    })));
                }
            }
        }
    }
}
