use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::shared::Shared;
use crate::gate::Gate;

/// The middleware [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)
/// wraps a service with.
///
/// ```
/// use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor};
/// use tower::Layer;
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 2).build()?;
/// let svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
///     Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Empty::<bytes::Bytes>::new()))
/// }));
/// let _clone = svc.clone(); // clones share the same counts
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> ConcurrencyLimitService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    inner_service_accessors!(inner);
}

impl<S: std::fmt::Debug> std::fmt::Debug for ConcurrencyLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimitService")
            .field("inner", &self.inner)
            .field("rule", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
    ResBody: crate::response::RefusalBody,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // No slot is taken here: a slot held across an unready inner
        // service would block the key for requests never sent.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let gate = Gate::call(
            &mut self.inner,
            req,
            |parts| shared.decide(parts),
            |parts, stopped| shared.suspend(parts, stopped),
        );
        ResponseFuture { gate }
    }
}
