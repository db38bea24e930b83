#![doc = include_str!("../../docs/rate_limit.md")]

mod builder;
mod control;
mod future;
mod layer;
mod service;
mod shared;

pub use builder::RateLimitBuilder;
pub use control::Control;
pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
#[cfg(feature = "config")]
pub(crate) use layer::WeakLayer;
pub use service::RateLimitService;
