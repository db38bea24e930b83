#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod algorithm;
pub mod backend;
pub mod decision;
pub mod error;
pub mod key;
pub mod rule;

pub use algorithm::Algorithm;
pub use decision::{Decision, RateLimitDecision, RuleDecision, Source};
pub use key::Key;
pub use rule::quota::Quota;
