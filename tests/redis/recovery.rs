//! Recovery after an outage: a gateway that was idle while a private
//! `redis-server` was down has its first request decided by Redis once the
//! server is back, not by the failure mode on a stale connection.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::gateway::{hit, layer_with};
use crate::support::source_app as app;
use crate::support::{client, serve};
use keyed_rate_limit::Quota;
use keyed_rate_limit::failure::{BreakerState, FailureMode};
use keyed_rate_limit_testing::RedisServer;

/// Kills the server, waits `down` and starts it again on the same port.
async fn outage(server: &mut RedisServer, down: Duration) {
    server.kill();
    tokio::time::sleep(down).await;
    server.restart();
}

#[tokio::test]
async fn an_idle_gateway_asks_redis_first_after_a_restart() {
    let mut server = RedisServer::start();
    // Fail closed: a failure-mode decision is a 429, Redis's a 200.
    let layer = layer_with(
        server.backend("idle").await,
        "idle",
        FailureMode::FailClosed,
        Quota::per_hour(1000),
    );
    let url = serve(app(layer.clone())).await;
    let c = client();
    for down in [Duration::from_millis(100), Duration::from_millis(700)] {
        assert_eq!(hit(&c, &url).await, (200, "global".into()));
        outage(&mut server, down).await;
        assert_eq!(
            hit(&c, &url).await,
            (200, "global".into()),
            "the first request after a {down:?} outage is Redis's"
        );
        assert_eq!(layer.breakers()[0].state, BreakerState::Closed);
    }
}

#[tokio::test]
async fn a_rule_quiet_through_an_outage_asks_redis_first_when_it_ends() {
    let mut server = RedisServer::start();
    let backend = server.backend("quiet").await;
    let quota = Quota::per_hour(1000);
    // One connection, two rules: the busy one meets the outage (and the
    // failed reconnects), the quiet one is asked only after it.
    let busy = layer_with(backend.clone(), "busy", FailureMode::FailClosed, quota);
    let quiet = layer_with(backend, "quiet", FailureMode::FailClosed, quota);
    let (busy_url, quiet_url) = (serve(app(busy)).await, serve(app(quiet.clone())).await);
    let c = client();
    assert_eq!(hit(&c, &quiet_url).await, (200, "global".into()));
    server.kill();
    for _ in 0..3 {
        assert_eq!(hit(&c, &busy_url).await.0, 429, "fails closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.restart();
    assert_eq!(
        hit(&c, &quiet_url).await,
        (200, "global".into()),
        "the quiet rule's first request after the outage is Redis's"
    );
    assert_eq!(quiet.breakers()[0].state, BreakerState::Closed);
}
