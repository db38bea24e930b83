//! The helpers every test binary shares (each includes this tree as
//! `mod support`): real axum servers on ephemeral ports, header parsing,
//! captured events and metrics. The `redis-server` launchers are in the
//! `keyed-rate-limit-testing` workspace crate.
#![allow(dead_code)]

pub mod accounting;
#[cfg(feature = "redis")]
pub mod admits;
#[cfg(feature = "redis")]
mod backend;
pub mod bandwidth;
pub mod cost;
pub mod draft;
pub mod durations;
pub mod events;
#[cfg(feature = "redis")]
pub mod gateway;
#[cfg(feature = "metrics")]
pub mod late_refund;
pub mod load;
pub mod metrics;
pub mod promtool;
pub mod sf;
#[cfg(feature = "redis")]
pub mod soak;
pub mod wait;
pub mod web;

#[cfg(feature = "redis")]
#[allow(unused_imports)]
pub use backend::Backend;
pub use web::{client, header, ok_app, serve};

use axum::routing::get;
use axum::{Extension, Router};
use keyed_rate_limit::{Algorithm, RateLimitLayer, decision::RateLimitDecision};

/// Every algorithm, for tests that run each on Redis.
pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// `GET /` answers with the source of the first rule's decision.
pub fn source_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<RateLimitDecision>| async move {
                d.rules()
                    .first()
                    .map_or("none", |r| r.source.as_str())
                    .to_owned()
            }),
        )
        .layer(layer)
}

/// `GET url` with `headers`, from a fresh client.
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client().get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// Sends `n` GETs with `headers`, each from a fresh client, and returns
/// their status codes.
pub async fn statuses_with(url: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get_with(url, headers).await.status().as_u16());
    }
    out
}

/// A rules file with a shadow rule, a local rule and a global one: the
/// config tests read it, and the Redis ones serve it.
pub const CONFIG_TOML: &str = r#"
headers = "both"
instances = 1
max_key_len = 64

[[rules]]
name = "dark-launch"
key = "everyone"
quota = "1/min"
shadow = true

[[rules]]
name = "per-key"
key = "header:x-api-key|peer_ip"
quota = "3/min"
burst = 3
algorithm = "gcra"

[[rules]]
name = "per-tenant"
key = "extension:tenant"
quota_fn = "plan"
cost_fn = "weight"
algorithm = "fixed_window"
scope = "global"
failure_mode = "fail_closed"
timeout = "500ms"
breaker = { failure_threshold = 3, open_for = "2s" }
on_missing_key = "reject:401"
"#;

/// The code block after `heading` in docs/config.md, as the guide shows it.
pub fn guide_block(heading: &str, fence: &str) -> String {
    const GUIDE: &str = include_str!("../../docs/config.md");
    let after = &GUIDE[GUIDE.find(heading).expect(heading)..];
    let start = after.find(fence).expect(fence) + fence.len();
    let body = &after[start..];
    body[..body.find("\n```").unwrap()]
        .trim_start_matches('\n')
        .to_owned()
}

/// Sends `n` GETs and returns their status codes.
pub async fn statuses(client: &reqwest::Client, url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(client.get(url).send().await.unwrap().status().as_u16());
    }
    out
}

/// Seconds from now to the end of calendar quota `q`'s current window
/// (rounded up), and the window's length.
pub fn calendar_window_now(q: &keyed_rate_limit::Quota) -> (u64, u64) {
    let now = std::time::SystemTime::now();
    let (start, end) = q.calendar_window(now).unwrap();
    let left = end.duration_since(now).unwrap().as_secs_f64().ceil() as u64;
    (left, end.duration_since(start).unwrap().as_secs())
}

/// envoyproxy/ratelimit's reset, `len - now % len` seconds, on the system
/// clock moved `offset` seconds east: the time to the edge of an aligned
/// window of `len` seconds, worked out apart from the crate.
pub fn envoy_reset(len: u64, offset: i32) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let shifted = now.checked_add_signed(offset.into()).unwrap();
    len - shifted % len
}

/// An offset east of UTC that puts the next edge of aligned windows of
/// `len` seconds (at most a day) `ahead` seconds from now: a test that
/// never straddles an edge, or one that waits for it.
pub fn aligned_edge_in(len: u64, ahead: u64) -> i32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    i32::try_from((len - (now + ahead) % len) % len).unwrap()
}

/// The keys matching `pattern` on `server` but the live instance count's
/// set, which every backend keeps by default: the rules' state.
#[cfg(feature = "redis")]
pub fn state_keys(server: &keyed_rate_limit_testing::RedisServer, pattern: &str) -> Vec<Vec<u8>> {
    let mut keys = server.keys(pattern);
    keys.retain(|k| !k.ends_with(b"}:live"));
    keys
}
