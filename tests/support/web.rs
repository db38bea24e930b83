//! Real HTTP on 127.0.0.1: an app served on an ephemeral port, a client
//! and its responses' headers.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use keyed_rate_limit::RateLimitLayer;

/// `GET /` answering `ok` behind `layer`.
pub fn ok_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

/// Serves `app` on 127.0.0.1:0 with `ConnectInfo`, returning its base URL.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    format!("http://{addr}")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}
