//! The app and the limiter setups the load examples share, so that every
//! measurement compares the same things.

// Each example uses its own part of this.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use governor::clock::QuantaInstant;
use governor::middleware::{NoOpMiddleware, StateInformationMiddleware};
use http::Request;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, headers::HeaderStyle};
use tower_governor::GovernorError;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

pub const KEY_HEADER: &str = "x-api-key";
pub const KEY: &str = "loadtest";

pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A client that keeps one connection alive: a load task each.
pub fn connection() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .unwrap()
}

/// The request every load sends.
pub fn hello(client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
    client.get(url).header(KEY_HEADER, KEY)
}

pub fn app() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// 1e9 per second with a burst of 1e9: never denies, like the benches.
pub fn huge() -> Quota {
    Quota::new(1_000_000_000, Duration::from_secs(1))
}

/// The local rule every comparison uses.
pub fn local_rule(name: &str) -> Rule {
    Rule::new(name, KeyExtractor::header(KEY_HEADER), huge())
}

/// The layer with the local rule; `extension: false` leaves the decision
/// out of the request extensions (nothing here reads it).
fn local_layer(extension: bool, headers: HeaderStyle) -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(local_rule("local"))
        .decision_extension(extension)
        .headers(headers)
        .build()
        .unwrap()
}

/// The variants of issue 13's accounting, each with the default headers and
/// extension: `count-if` settles every response (`count_if` that always
/// counts), `two-rules` is [`local_rule`] twice (each spend is recorded for
/// a refund), `deny-refund` / `deny-no-refund` put a rule that has denied
/// everything since the first request after [`local_rule`], so each
/// request is a 429 whose first rule's unit is (or is not) given back.
pub fn accounting(variant: &str) -> Router {
    let b = RateLimitLayer::builder();
    let b = match variant {
        "count-if" => b.rule(local_rule("local").count_if(|res| !res.status.is_success())),
        "two-rules" => b.rule(local_rule("local")).rule(local_rule("second")),
        "deny-refund" | "deny-no-refund" => b
            .rule(local_rule("local"))
            .rule(Rule::new(
                "closed",
                KeyExtractor::everyone(),
                Quota::per_hour(1),
            ))
            .refunds(variant == "deny-refund"),
        other => panic!("unknown variant {other}"),
    };
    app().layer(b.build().unwrap())
}

/// One rule that has denied everything since the first request: each
/// request is a local 429 with the default headers and body.
pub fn layer_deny() -> Router {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "closed",
            KeyExtractor::everyone(),
            Quota::per_hour(1),
        ))
        .build()
        .unwrap();
    app().layer(layer)
}

/// `tower_governor` with its headers, denying everything after the first
/// request: its 429, beside [`layer_deny`].
pub fn tower_governor_deny() -> Router {
    let mut config = GovernorConfigBuilder::default().key_extractor(HeaderKey);
    config.period(Duration::from_secs(3600)).burst_size(1);
    let config = config.use_headers().finish().unwrap();
    app().layer(GovernorLayer::new(Arc::new(config)))
}

/// [`local_layer`] on the app's routes.
pub fn layer_local(extension: bool, headers: HeaderStyle) -> Router {
    app().layer(local_layer(extension, headers))
}

/// tower_governor keyed by the same header as ours.
#[derive(Clone)]
struct HeaderKey;

impl tower_governor::key_extractor::KeyExtractor for HeaderKey {
    type Key = bytes::Bytes;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get(KEY_HEADER)
            .map(|v| bytes::Bytes::copy_from_slice(v.as_bytes()))
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn governor_config() -> GovernorConfigBuilder<HeaderKey, NoOpMiddleware<QuantaInstant>> {
    let mut config = GovernorConfigBuilder::default().key_extractor(HeaderKey);
    config
        .period(Duration::from_nanos(1))
        .burst_size(1_000_000_000);
    config
}

/// `tower_governor` with the same key and quota, and its rate-limit headers
/// on (`use_headers`), so both limiters answer with headers.
fn governor_with_headers() -> GovernorLayer<HeaderKey, StateInformationMiddleware, Body> {
    let config = governor_config().use_headers().finish().unwrap();
    GovernorLayer::new(Arc::new(config))
}

/// [`governor_with_headers`] on the app's routes.
pub fn tower_governor() -> Router {
    app().layer(governor_with_headers())
}

/// Which limiter [`serve_outer`] wraps around the whole router.
#[derive(Clone, Copy)]
pub enum Outer {
    Layer,
    TowerGovernor,
}

/// Serves `app` with a limiter wrapped around the whole router (a
/// `tower::Layer`) rather than added to its routes with `Router::layer`,
/// which boxes every layer's service and future per request. Keys then
/// can't use the matched route, which the router hasn't found yet.
pub async fn serve_outer(listener: tokio::net::TcpListener, app: Router, outer: Outer) {
    match outer {
        Outer::Layer => {
            let layer = local_layer(true, HeaderStyle::Draft);
            serve_made(listener, tower::Layer::layer(&layer, app)).await
        }
        Outer::TowerGovernor => {
            let layer = governor_with_headers();
            serve_made(listener, tower::Layer::layer(&layer, app)).await
        }
    }
}

async fn serve_made<S>(listener: tokio::net::TcpListener, svc: S)
where
    S: tower::Service<
            axum::extract::Request,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let make = axum::ServiceExt::<axum::extract::Request>::into_make_service(svc);
    axum::serve(listener, make).await.unwrap();
}

/// `tower_governor` without headers.
pub fn tower_governor_no_headers() -> Router {
    let config = governor_config().finish().unwrap();
    app().layer(GovernorLayer::new(Arc::new(config)))
}
