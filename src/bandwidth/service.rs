use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::ShapedBody;
use super::future::ResponseFuture;
use super::shared::Shared;
use super::wrap::WrapRequest;
use crate::gate::Gate;

/// The middleware [`BandwidthLimitLayer`](super::BandwidthLimitLayer)
/// wraps a service with. The inner service gets the request body wrapped
/// in a [`ShapedBody`] (paced when the direction includes requests).
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor, bandwidth::ShapedBody};
/// use tower::{Layer, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = BandwidthLimitLayer::builder("downloads", KeyExtractor::everyone(), 65_536).build()?;
/// let svc = layer.layer(tower::service_fn(|_req: http::Request<ShapedBody<Full<Bytes>>>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from("csv"))))
/// }));
/// let _clone = svc.clone(); // clones share the same budgets
/// let res = svc.oneshot(http::Request::new(Full::new(Bytes::new()))).await?;
/// assert!(res.body().is_shaped());
/// assert_eq!(res.into_body().collect().await?.to_bytes(), "csv");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct BandwidthLimitService<S> {
    inner: WrapRequest<S>,
    shared: Arc<Shared>,
}

impl<S> BandwidthLimitService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self {
            inner: WrapRequest::new(inner, shared.clone()),
            shared,
        }
    }

    inner_service_accessors!(inner.inner);
}

impl<S: std::fmt::Debug> std::fmt::Debug for BandwidthLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BandwidthLimitService")
            .field("inner", &self.inner.inner)
            .field("limit", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BandwidthLimitService<S>
where
    S: Service<Request<ShapedBody<ReqBody>>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
    ResBody: crate::response::RefusalBody,
{
    type Response = Response<ShapedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Nothing is spent before the body moves: readiness is the inner's.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let gate = Gate::call(
            &mut self.inner,
            req,
            |parts| shared.decide(parts),
            |parts, find| shared.suspend(parts, find),
        );
        let shared = shared.clone();
        ResponseFuture { gate, shared }
    }
}
