#![doc = include_str!("../../docs/concurrency.md")]
#![cfg_attr(feature = "redis", doc = include_str!("../../docs/concurrency_redis.md"))]

mod body;
mod builder;
mod future;
#[cfg(feature = "redis")]
mod global;
#[cfg(feature = "redis")]
mod global_options;
mod layer;
mod permit;
mod service;
mod shared;
#[cfg(feature = "redis")]
mod slot;
mod slot_store;

pub use body::ResponseBody;
pub use builder::ConcurrencyLimitBuilder;
pub use future::ResponseFuture;
pub use layer::ConcurrencyLimitLayer;
pub use service::ConcurrencyLimitService;
