#![doc = include_str!("../../docs/rate_limit.md")]
#![cfg_attr(feature = "tonic", doc = include_str!("../../docs/grpc.md"))]
#![cfg_attr(
    not(feature = "tonic"),
    doc = "# gRPC\n\nWith the `tonic` feature, the layers wrap a tonic `Server`; this section then holds the gRPC guide: what each status means to a client, and a client that waits out `grpc-retry-pushback-ms`."
)]

mod builder;
mod control;
mod future;
mod keyed;
mod layer;
mod service;
mod shared;

pub use crate::engine::ControlError;
pub use builder::RateLimitBuilder;
pub use control::Control;
pub use future::ResponseFuture;
pub use keyed::{KeyedAnswer, KeyedAsk, KeyedRules, RuleIndex};
pub use layer::RateLimitLayer;
#[cfg(feature = "config")]
pub(crate) use layer::WeakLayer;
pub use service::RateLimitService;
