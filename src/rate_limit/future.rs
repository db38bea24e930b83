use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use crate::engine::Settlement;
use crate::gate::Gate;
use crate::response::RefusalBody;

pin_project_lite::pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService).
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        pub(super) gate: Gate<S, ReqBody, Option<Box<Settlement>>>,
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: RefusalBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().gate.poll(cx).map(|r| {
            r.map(|(res, settle)| match settle.flatten() {
                Some(s) => settled(res, *s),
                None => res,
            })
        })
    }
}

/// Settles the reserved costs on the response head, body untouched.
#[inline(never)]
fn settled<B>(res: Response<B>, settlement: Settlement) -> Response<B> {
    let (parts, body) = res.into_parts();
    settlement.settle(&parts);
    Response::from_parts(parts, body)
}
