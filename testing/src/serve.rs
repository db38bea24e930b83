//! Gateways as users deploy them: axum servers on 127.0.0.1:0.

use std::future::Future;

use axum::Router;

/// Builds an app on `rt` and serves it there, as a gateway of its own: a
/// Redis backend the app connects while it is built reads its replies on
/// `rt` too. Returns `http://127.0.0.1:port/`.
pub async fn serve_on<F, Fut>(rt: &tokio::runtime::Handle, make: F) -> String
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Router> + Send,
{
    rt.spawn(async move {
        let app = make().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        format!("http://{addr}/")
    })
    .await
    .expect("the gateway task")
}

/// A 2-worker runtime, the size of the box the gateways share.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
