//! The remote layer, its service and its response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower::{Layer, Service};

use super::remote::Remote;
use crate::gate::{Admission, Gate};
use crate::headers::Rendered;
use crate::response::RefusalBody;

/// A layer whose decisions a remote rate-limit service makes; see the
/// [module page](super). Cheap to clone.
#[derive(Clone)]
pub struct RemoteRateLimitLayer {
    pub(super) remote: Arc<Remote>,
}

impl std::fmt::Debug for RemoteRateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRateLimitLayer")
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for RemoteRateLimitLayer {
    type Service = RemoteRateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RemoteRateLimitService {
            inner,
            remote: self.remote.clone(),
        }
    }
}

/// The service [`RemoteRateLimitLayer`] wraps around another.
#[derive(Clone)]
pub struct RemoteRateLimitService<S> {
    inner: S,
    remote: Arc<Remote>,
}

impl<S> RemoteRateLimitService<S> {
    inner_service_accessors!(inner);
}

impl<S: std::fmt::Debug> std::fmt::Debug for RemoteRateLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RemoteRateLimitService<S>
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
        let remote = &self.remote;
        ResponseFuture {
            gate: Gate::call(
                &mut self.inner,
                req,
                |parts| {
                    // Nothing to ask about: no call at all.
                    let descriptors = remote.descriptors(parts);
                    if descriptors.is_empty() {
                        Ok(Admission::Go(Rendered::new(), ()))
                    } else {
                        Err(descriptors)
                    }
                },
                |parts, descriptors| Box::pin(remote.clone().ask(parts, descriptors)),
            ),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RemoteRateLimitService`].
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        gate: Gate<S, ReqBody, ()>,
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: RefusalBody,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().gate.poll(cx).map(|r| r.map(|(res, _)| res))
    }
}
