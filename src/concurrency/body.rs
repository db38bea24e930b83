use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::permit::Permit;

pin_project_lite::pin_project! {
    /// The body of a response through
    /// [`ConcurrencyLimitService`](super::ConcurrencyLimitService): holds the
    /// request's slot until the body ends or is dropped, so a streaming
    /// response counts as in flight until its last byte.
    ///
    /// ```
    /// use http_body_util::{BodyExt, Full};
    /// use keyed_rate_limit::{ConcurrencyLimitLayer, Key, KeyExtractor};
    /// use tower::{ServiceBuilder, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limit = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 2).build()?;
    /// let svc = ServiceBuilder::new().layer(limit.clone()).service_fn(|_req: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from("csv"))))
    /// });
    /// let res = svc.oneshot(http::Request::new(())).await?;
    /// // The headers are out, but the body is not read yet: the slot is held.
    /// assert_eq!(limit.in_flight(&Key::from("*")), 1);
    /// let body = res.into_body().collect().await?.to_bytes();
    /// assert_eq!(body, "csv");
    /// assert_eq!(limit.in_flight(&Key::from("*")), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        body: B,
        permit: Option<Permit>,
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn new(body: B, permit: Option<Permit>) -> Self {
        Self { body, permit }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        let mut body = this.body;
        let frame = ready!(body.as_mut().poll_frame(cx));
        // Free the slot as soon as the body is done; the server may keep the
        // body value around until the connection moves on.
        if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
            this.permit.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("holds_permit", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}
