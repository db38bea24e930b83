//! Per-key bandwidth shaping: at most N body bytes a second per key, e.g.
//! a download limit per API key, or an upload limit per client IP.
//!
//! [`BandwidthLimitLayer`] takes the same [`KeyExtractor`](crate::KeyExtractor)s
//! and [`OnMissingKey`](crate::OnMissingKey) policies as rate rules (so a
//! key *source* missing from the setup is a 500, not an unlimited body). It
//! refuses nothing: it wraps the bodies ([`ShapedBody`]) of the
//! [`Direction`] chosen, and when a key's byte budget is spent the body
//! pauses on a timer until enough bytes are back. Bodies are never cut and
//! never buffered beyond the one frame being let out: a large frame is
//! split into pieces no larger than the burst, without copying. It works
//! on any body of `Bytes`: downloads, server-sent events, gRPC streams,
//! uploads (`Direction::Request`). All the bodies of one key, on every
//! connection, share the key's rate.
//!
//! The budget is a GCRA bucket of `bytes_per_second` with a
//! [`burst`](BandwidthLimitBuilder::burst) (default one second's worth),
//! kept in the same bounded key store as local rules
//! ([`max_keys`](BandwidthLimitBuilder::max_keys)). With the `redis`
//! feature, `BandwidthLimitBuilder::global` counts every
//! gateway's bytes in Redis, leased in blocks so that no frame waits for
//! Redis while the lease lasts.
//!
//! Responses of a shaped key carry `RateLimit-Policy:
//! "downloads";q=1048576;w=1;qu="content-bytes"` (draft header styles); a
//! `RateLimit` field is not sent, since the bytes left change with every
//! frame.
//!
//! # Recipe: a download limit per API key
//!
//! ```
//! use axum::{Router, http::StatusCode, routing::get};
//! use keyed_rate_limit::{BandwidthLimitLayer, BuildError, KeyExtractor, OnMissingKey};
//!
//! fn app() -> Result<Router, BuildError> {
//!     // 1 MiB/s per API key; at most 64 KiB at once.
//!     let downloads = BandwidthLimitLayer::builder("downloads", KeyExtractor::header("x-api-key"), 1 << 20)
//!         .burst(64 * 1024)
//!         .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
//!         .build()?;
//!     Ok(Router::new()
//!         .route("/files/{name}", get(|| async { vec![0u8; 10 << 20] }))
//!         .layer(downloads))
//! }
//! # app().unwrap();
//! ```
//!
//! Combine it with a [`RateLimitLayer`](crate::RateLimitLayer) to bound
//! how many downloads start, and a
//! [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) to bound how
//! many run at once.

mod body;
mod builder;
mod future;
#[cfg(feature = "redis")]
mod global;
mod layer;
mod service;
mod shared;
mod wrap;

pub use body::ShapedBody;
pub use builder::BandwidthLimitBuilder;
pub use future::ResponseFuture;
pub use layer::BandwidthLimitLayer;
pub use service::BandwidthLimitService;
pub use shared::Direction;
