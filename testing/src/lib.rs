//! Launchers the tests, benches and measurement programs of
//! `keyed-rate-limit` share: private `redis-server` processes (plain, TLS,
//! a cluster) on ephemeral ports of 127.0.0.1, never the shared 6379,
//! gateways on runtimes of their own, and the interleaved rounds that
//! benchmarks report paired ratios from.
//!
//! Unpublished; it does not depend on the crate it tests.

mod envoy;
mod redis_cluster;
mod redis_sentinel;
mod redis_server;
pub mod rounds;
mod serve;
mod tls;

pub use envoy::Envoy;
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::{MASTER_NAME, SentinelGroup, role};
pub use redis_server::{FREE_PORT, RedisServer, free_port, server_binary};
pub use serve::{runtime, serve_on};
