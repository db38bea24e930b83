#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

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
pub mod observe;
pub mod quota;
pub mod rate_limit;
pub mod response;
pub mod rule;

pub use algorithm::Algorithm;
pub use concurrency::{ConcurrencyLimitLayer, ConcurrencyLimitService};
pub use decision::{Decision, RateLimitDecision, RuleDecision, Source};
pub use headers::HeaderStyle;
pub use key::Key;
pub use quota::Quota;
pub use rate_limit::{RateLimitBuilder, RateLimitLayer, RateLimitService};
pub use rule::Rule;
