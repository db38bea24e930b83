use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::ShapedBody;
use super::shared::{Shaping, Shared};
use super::wrap::WrapRequest;
use crate::gate::Gate;

pin_project_lite::pin_project! {
    /// Response future of [`BandwidthLimitService`](super::BandwidthLimitService).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ShapedBody<ReqBody>>>,
    {
        #[pin]
        pub(super) gate: Gate<WrapRequest<S>, ReqBody, Shaping>,
        pub(super) shared: Arc<Shared>,
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ShapedBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: crate::response::RefusalBody,
{
    type Output = Result<Response<ShapedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let shared = this.shared;
        this.gate.poll(cx).map(|r| {
            r.map(|(res, key)| {
                let shaped = key.flatten().map(|k| (shared.clone(), k));
                res.map(|b| ShapedBody::new(b, shaped))
            })
        })
    }
}
