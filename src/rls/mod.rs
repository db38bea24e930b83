#![doc = include_str!("../../docs/rls.md")]
#![doc = include_str!("../../docs/rls_envoy.md")]

// envoyproxy/ratelimit's YAML into a descriptor tree of the crate's rules.
mod config;
// `ShouldRateLimit` over a layer of those rules.
mod server;
// A descriptor's answer in Envoy's terms.
mod status;
// A layer that asks a remote rate-limit service.
pub mod client;

pub use config::RlsConfig;
/// The tonic service [`RateLimitServer::into_service`] returns (envoy-types).
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
pub use server::{RateLimitServer, RateLimitServerBuilder};
