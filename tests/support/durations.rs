//! Layers set with an extreme duration, served over HTTP, and a per-thread
//! panic count: what tests/local/durations.rs and tests/redis/durations.rs
//! share.

use std::cell::Cell;
use std::sync::{Arc, Once};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
use tokio::sync::Notify;
use tower::ServiceExt;

thread_local! {
    static PANICS: Cell<usize> = const { Cell::new(0) };
}

pub const EXTREMES: [Duration; 2] = [Duration::ZERO, Duration::MAX];

/// How long a layer has to answer everything it is sent.
pub const SOON: Duration = Duration::from_secs(10);

/// Panics so far on this thread (the hook keeps printing them).
pub fn panics() -> usize {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|n| n.set(n.get() + 1));
            prev(info);
        }));
    });
    PANICS.with(Cell::get)
}

/// A request held in its handler: `entered` when it is, answered when
/// `release` is notified.
#[derive(Clone, Default)]
pub struct Hold {
    pub entered: Arc<Notify>,
    pub release: Arc<Notify>,
}

/// `GET /` answering at once and `GET /hold` held by `hold`, behind `layer`.
pub fn app<L>(layer: L, hold: Hold) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/hold",
            get(move || async move {
                hold.entered.notify_one();
                hold.release.notified().await;
                "ok"
            }),
        )
        .layer(layer)
}

pub fn get_req(path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", "alice")
        .body(Body::empty())
        .unwrap()
}

/// Sends `n` requests one after the other; each must be a 2xx or a 429.
pub async fn statuses(app: &Router, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let res = tokio::time::timeout(SOON, app.clone().oneshot(get_req("/")))
            .await
            .expect("answered soon")
            .unwrap();
        assert_sane(res.status());
        out.push(res.status().as_u16());
    }
    out
}

pub fn assert_sane(s: StatusCode) {
    assert!(
        s.is_success() || s == StatusCode::TOO_MANY_REQUESTS,
        "a 2xx or a 429, not {s}"
    );
}

/// Runs `case` and checks that nothing panicked meanwhile on this thread,
/// a spawned task included (given a moment to run).
pub async fn no_panic<F: Future<Output = ()>>(what: &str, case: F) {
    let before = panics();
    tokio::time::timeout(SOON * 3, case)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done in time"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(panics(), before, "{what}: a task panicked");
}

pub fn rule(quota: Quota) -> Rule {
    Rule::new("r", KeyExtractor::header("x-user"), quota)
}

/// Builds `rule`, expecting an error exactly when `refused`, and sends
/// `n` requests when it builds; returns their statuses.
pub async fn run(rule: Rule, refused: bool, n: usize) -> Vec<u16> {
    run_with(
        RateLimitLayer::builder().rule(rule).instances(1),
        refused,
        n,
    )
    .await
}

pub async fn run_with(
    b: keyed_rate_limit::rate_limit::RateLimitBuilder,
    refused: bool,
    n: usize,
) -> Vec<u16> {
    match b.build() {
        Err(e) => {
            assert!(refused, "refused: {e}");
            Vec::new()
        }
        Ok(layer) => {
            assert!(!refused, "built");
            statuses(&app(layer, Hold::default()), n).await
        }
    }
}

/// One request held in flight, then another: the limit of one refuses it,
/// with whatever `Retry-After` the setting makes; then both are free.
pub async fn held_then_refused(layer: ConcurrencyLimitLayer) {
    let hold = Hold::default();
    let app = app(layer, hold.clone());
    let held = tokio::spawn(app.clone().oneshot(get_req("/hold")));
    tokio::time::timeout(SOON, hold.entered.notified())
        .await
        .expect("the held request is in soon");
    let res = tokio::time::timeout(SOON, app.clone().oneshot(get_req("/")))
        .await
        .expect("answered soon")
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    hold.release.notify_one();
    let res = tokio::time::timeout(SOON, held)
        .await
        .expect("answered soon")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    drop(res); // Its body held the slot, given back on a task for Redis.
    for _ in 0..100 {
        if statuses(&app, 1).await == [200] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the slot is back soon");
}
