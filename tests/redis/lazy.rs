//! `connect_lazily()` under every connection mode: a gateway starts while
//! Redis is down, its rules follow their failure mode, and exact limiting
//! begins once Redis answers.

use crate::support::gateway::{hit, layer_with, until_global};
use crate::support::source_app as app;
use crate::support::{client, serve};
use keyed_rate_limit::Quota;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{
    RedisBackend,
    backend::redis::{ConnectionMode, RedisBackendBuilder},
};
use keyed_rate_limit_testing::RedisServer;

/// Builds `builder` lazily, serves a fail-closed rule on it, checks the 429
/// while Redis is down, runs `revive`, and waits for Redis decisions.
async fn starts_down_then_limits(builder: RedisBackendBuilder, revive: impl FnOnce()) {
    let lazy = builder
        .prefix("lazy")
        .connect_lazily()
        .build()
        .await
        .expect("no connection is made at build");
    let url = serve(app(layer_with(
        lazy,
        "lazy",
        FailureMode::FailClosed,
        Quota::per_hour(100),
    )))
    .await;
    let c = client();
    assert_eq!(
        hit(&c, &url).await.0,
        429,
        "fail-closed while Redis is down"
    );
    revive();
    until_global(&c, &url).await;
}

#[tokio::test]
async fn a_multiplexed_gateway_starts_while_redis_is_down() {
    let mut server = RedisServer::start();
    server.kill();
    let builder = RedisBackend::builder(server.url());
    starts_down_then_limits(builder, || server.restart()).await;
}

#[tokio::test]
async fn a_pooled_gateway_starts_while_redis_is_down() {
    let mut server = RedisServer::start();
    server.kill();
    let builder =
        RedisBackend::builder(server.url()).connection(ConnectionMode::Pool { max_size: 4 });
    // Without connect_lazily the pool's first connection fails the build.
    assert!(builder.clone().build().await.is_err());
    starts_down_then_limits(builder, || server.restart()).await;
}

#[cfg(feature = "redis-cluster")]
#[tokio::test]
async fn a_cluster_gateway_starts_while_the_cluster_is_down() {
    let mut cluster = keyed_rate_limit_testing::RedisCluster::start();
    for node in &mut cluster.nodes {
        node.kill();
    }
    let builder = RedisBackend::cluster_builder(cluster.urls());
    assert!(builder.clone().build().await.is_err());
    starts_down_then_limits(builder, || {
        // Each node comes back with its slots from its nodes.conf.
        for node in &mut cluster.nodes {
            node.restart();
        }
        cluster.wait_ok();
    })
    .await;
}

#[cfg(feature = "redis-sentinel")]
#[tokio::test]
async fn a_sentinel_gateway_starts_while_the_sentinels_are_down() {
    let mut group = keyed_rate_limit_testing::SentinelGroup::start();
    for s in &mut group.sentinels {
        s.kill();
    }
    let builder = RedisBackend::sentinel_builder(
        group.sentinel_urls(),
        keyed_rate_limit_testing::MASTER_NAME,
    );
    assert!(builder.clone().build().await.is_err());
    starts_down_then_limits(builder, || {
        for s in &mut group.sentinels {
            s.restart();
        }
    })
    .await;
}
