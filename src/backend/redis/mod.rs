#![doc = include_str!("../../../docs/redis.md")]
#![cfg_attr(feature = "redis-tls", doc = include_str!("../../../docs/redis_tls.md"))]
#![cfg_attr(feature = "redis-cluster", doc = include_str!("../../../docs/redis_cluster.md"))]
#![cfg_attr(feature = "redis-sentinel", doc = include_str!("../../../docs/redis_sentinel.md"))]

mod backend;
mod builder;
mod conn;
mod endpoint;
mod error;
mod eviction;
mod instances;
mod keys;
mod membership;
mod pinger;
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
mod reconnect;
mod script;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
#[cfg(feature = "redis-sentinel")]
mod sentinel_builder;
#[cfg(feature = "redis-tls")]
mod tls;

pub use backend::RedisBackend;
pub(crate) use backend::Shard;
pub use builder::{DEFAULT_LIVE_TTL, RedisBackendBuilder};
pub use endpoint::ConnectionMode;
pub use error::RedisBackendError;
pub(crate) use membership::process_id;
pub(crate) use script::{
    Decided, Grant, LeaseAsk, Locking, MAX_PREVIOUS, Previous, Record, SlotOp, SlotReply, Target,
};
