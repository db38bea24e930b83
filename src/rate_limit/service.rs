use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::future::ResponseFuture;
use super::{Conclusion, Shared};
use crate::response::{ResponseBody, is_grpc};

/// The middleware [`RateLimitLayer`](super::RateLimitLayer) wraps a service with.
///
/// Rules whose keys and backends answer at once are evaluated inside `call`
/// with no allocation for a future; an async key or a Redis rule moves the
/// rest of the evaluation into the response future.
pub struct RateLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimitService<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone> Clone for RateLimitService<S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
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
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let grpc = is_grpc(&parts.headers);
        match self.shared.chain.evaluate(&parts) {
            Ok(verdict) => match self.shared.conclude(verdict, grpc) {
                Conclusion::Go(headers, decision) => {
                    parts.extensions.insert(decision);
                    let fut = self.inner.call(Request::from_parts(parts, body));
                    ResponseFuture::calling(fut, headers)
                }
                Conclusion::Stop(res) => ResponseFuture::refused(res),
            },
            Err(suspended) => {
                // `self.inner` is the service `poll_ready` readied: take it
                // and leave a clone, as tower's docs prescribe.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let decide = Box::pin(self.shared.chain.clone().resume(parts, suspended));
                ResponseFuture::deciding(decide, inner, body, self.shared.clone(), grpc)
            }
        }
    }
}
