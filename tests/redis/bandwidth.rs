//! A global bandwidth limit on a private `redis-server`: two gateways share
//! a key's rate through leased byte budgets, with far fewer Redis calls
//! than frames.

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
use keyed_rate_limit_testing::RedisServer;

use crate::support::Backend as _;
use crate::support::bandwidth::{assert_near, endless, received};
use crate::support::serve;

const RATE: u32 = 2 * 1024 * 1024;
const BURST: u32 = 512 * 1024;
/// Frames of the streams: a realistic size, far below a lease.
const FRAME: usize = 8 * 1024;
/// The start-up burst is left out of the figures.
const SKIP: Duration = Duration::from_millis(500);
const WINDOW: Duration = Duration::from_secs(5);

async fn gateway(server: &RedisServer) -> String {
    let layer = BandwidthLimitLayer::builder("dl", KeyExtractor::header("x-key"), RATE)
        .burst(BURST)
        .global(server.backend("bw").await)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/stream", get(|| async { endless(FRAME) }))
        .layer(layer);
    format!("{}/stream", serve(app).await)
}

/// Key `g` streams on both gateways at once, key `h` on one: `g`'s two
/// streams share its rate, `h` has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_bandwidth_is_shared_across_gateways_on_leases() {
    let server = RedisServer::start();
    let (a, b) = (gateway(&server).await, gateway(&server).await);
    let calls = server.script_calls();
    let (g1, g2, h) = tokio::join!(
        received(&a, "g", SKIP, WINDOW),
        received(&b, "g", SKIP, WINDOW),
        received(&a, "h", SKIP, WINDOW),
    );
    let calls = server.script_calls() - calls;
    let secs = WINDOW.as_secs_f64();
    println!("key g: {g1} + {g2} bytes on two gateways");
    assert_near("global key g, two gateways", (g1 + g2) as f64 / secs, RATE);
    assert_near("global key h, alone", h as f64 / secs, RATE);
    // Over the 5.5 s of the streams, with the start-up burst.
    let frames = (g1 + g2 + h) / FRAME;
    println!("Redis calls: {calls} for about {frames} frames");
    assert!(
        calls * 4 < frames as u64,
        "{calls} Redis calls for {frames} frames"
    );
}
