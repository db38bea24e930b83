//! A value ready now, or a future of it: most steps of a decision are
//! synchronous, and the layer allocates a future only for one that awaits
//! (an async key extractor, a Redis call).

use futures_util::future::BoxFuture;

pub(crate) enum NowOrLater<T> {
    Now(T),
    Later(BoxFuture<'static, T>),
}

impl<T> NowOrLater<T> {
    pub(crate) async fn resolve(self) -> T {
        match self {
            Self::Now(v) => v,
            Self::Later(f) => f.await,
        }
    }
}
