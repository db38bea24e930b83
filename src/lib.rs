// The README's examples include a global rule: it is the crate's front page
// wherever the `redis` feature is on (docs.rs builds with all features).
#![cfg_attr(feature = "redis", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "redis"),
    doc = "A keyed rate-limiting tower `Layer` for axum routers and tonic services: \
           see [`RateLimitLayer`], [`ConcurrencyLimitLayer`], and README.md for the \
           guide (its examples use the `redis` feature)."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod algorithm;
pub mod backend;
pub mod concurrency;
#[cfg(feature = "config")]
pub mod config;
pub mod decision;
pub mod describe;
pub mod error;
pub mod failure;
mod gate;
pub mod headers;
pub mod key;
mod now_or_later;
pub mod observe;
pub mod quota;
pub mod rate_limit;
pub mod response;
pub mod rule;
mod settings;
mod throttle;

pub use algorithm::Algorithm;
pub use concurrency::{ConcurrencyLimitBuilder, ConcurrencyLimitLayer, ConcurrencyLimitService};
pub use decision::{Decision, RateLimitDecision, RuleDecision, Source};
pub use error::BuildError;
pub use failure::{BreakerConfig, FailureMode};
pub use headers::{HeaderStyle, ResetFormat};
pub use key::{Key, KeyExtractor, TrustedProxies};
pub use quota::Quota;
pub use rate_limit::{Control, RateLimitBuilder, RateLimitLayer, RateLimitService};
pub use rule::{OnDeny, OnMissingKey, Rule};
