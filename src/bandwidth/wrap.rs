//! The inner service as the gate calls it: the request body wrapped.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use tower::Service;

use super::body::ShapedBody;
use super::shared::{ShapeRequest, Shared};

/// Wraps the request body on its way to the inner service, with the key
/// the decision left in the extensions.
#[derive(Clone)]
pub(crate) struct WrapRequest<S> {
    pub(super) inner: S,
    shared: Arc<Shared>,
}

impl<S, B> Service<Request<B>> for WrapRequest<S>
where
    S: Service<Request<ShapedBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let shaped = parts
            .extensions
            .remove::<ShapeRequest>()
            .map(|ShapeRequest(key)| (self.shared.clone(), key));
        self.inner
            .call(Request::from_parts(parts, ShapedBody::new(body, shaped)))
    }
}

impl<S> WrapRequest<S> {
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self {
        Self { inner, shared }
    }
}
