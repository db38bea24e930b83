//! The client: a layer that asks a remote rate-limit service (this crate's,
//! envoyproxy/ratelimit, or any RLS v3 server) for each request's decision,
//! the way Envoy's `envoy.filters.http.ratelimit` filter does.
//!
//! Each descriptor is a list of entries whose values the crate's key
//! extractors read from the request; a descriptor with an entry its
//! extractor finds no key for is not sent (Envoy skips such an action
//! too). `OK` goes on with the `response_headers_to_add` (the draft
//! headers, from this crate's server); `OVER_LIMIT` is the crate's own 429
//! (gRPC: `RESOURCE_EXHAUSTED` with pushback), its `Retry-After` the
//! server's, or else the longest `duration_until_reset` of the descriptors
//! over their limits. The call has a timeout and a circuit breaker, and
//! Envoy's `failure_mode_deny` for when it fails or the breaker is open:
//! `false` (the default) lets the request through, `true` refuses it with
//! the breaker's wait.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Router, routing::get};
//! use keyed_rate_limit::KeyExtractor;
//! use keyed_rate_limit::rls::client::RemoteRateLimitLayer;
//!
//! # async fn app() -> Result<Router, keyed_rate_limit::BuildError> {
//! let limit = RemoteRateLimitLayer::builder("http://127.0.0.1:8081", "edge")
//!     .descriptor([("remote_address", KeyExtractor::peer_ip())])
//!     .descriptor([("user", KeyExtractor::header("x-user")), ("path", KeyExtractor::matched_route())])
//!     .timeout(Duration::from_millis(50))
//!     .failure_mode_deny(false)
//!     .build()?;
//! Ok(Router::new().route("/", get(|| async { "hi" })).layer(limit))
//! # }
//! ```

mod builder;
mod remote;
mod service;

pub use builder::RemoteRateLimitBuilder;
pub use service::{RemoteRateLimitLayer, RemoteRateLimitService, ResponseFuture};
