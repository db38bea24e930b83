#![doc = include_str!("../docs/rls.md")]
#![doc = include_str!("../docs/rls_envoy.md")]
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

// envoyproxy/ratelimit's YAML into a descriptor tree of the library's rules.
mod config;
// `ShouldRateLimit` over those rules, through the library's keyed door.
mod server;
// A descriptor's answer in Envoy's terms.
mod status;

pub use config::RlsConfig;
/// The tonic service [`RateLimitServer::into_service`] returns (envoy-types).
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
pub use server::{RateLimitServer, RateLimitServerBuilder};
