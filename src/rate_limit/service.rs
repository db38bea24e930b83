use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::future::ResponseFuture;
use super::shared::Shared;
use crate::gate::Gate;
use crate::response::RefusalBody;

/// The middleware [`RateLimitLayer`](super::RateLimitLayer) wraps a service with.
///
/// Rules whose keys and backends answer at once are evaluated inside `call`
/// with no allocation for a future; an async key or a Redis rule moves the
/// rest of the evaluation into the response future.
///
/// Responses keep the inner service's body type; the layer writes its own
/// refusals in it through [`RefusalBody`](crate::response::RefusalBody),
/// implemented for axum's and tonic's bodies and `Full<Bytes>`.
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimitService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    inner_service_accessors!(inner);
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
    ResBody: RefusalBody,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let shared = &self.shared;
        let gate = Gate::call(
            &mut self.inner,
            req,
            |parts| shared.decide(parts),
            |parts, suspended| shared.clone().finish(parts, suspended),
        );
        ResponseFuture { gate }
    }
}
