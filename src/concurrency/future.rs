use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::ResponseBody;
use super::permit::Permit;
use crate::gate::Gate;

pin_project_lite::pin_project! {
    /// Response future of [`ConcurrencyLimitService`](super::ConcurrencyLimitService).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // The permit is held while the service runs, then moves into the body.
        #[pin]
        pub(super) gate: Gate<S, ReqBody, Option<Permit>>,
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: crate::response::RefusalBody,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project()
            .gate
            .poll(cx)
            .map(|r| r.map(|(res, permit)| res.map(|b| ResponseBody::new(b, permit.flatten()))))
    }
}
