#![doc = include_str!("../../../docs/redis.md")]

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
mod script;
#[cfg(feature = "redis-tls")]
mod tls;

pub use backend::RedisBackend;
pub use builder::RedisBackendBuilder;
pub use endpoint::ConnectionMode;
pub use error::RedisBackendError;
pub(crate) use membership::process_id;
pub(crate) use script::{ControlScriptOp, Decided, Grant, LeaseOp};
