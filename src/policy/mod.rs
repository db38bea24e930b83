//! The value types that rules, backends, failure handling and observability
//! share. They depend only on the quota, algorithm and error types, so
//! every layer can name them. Users reach the public ones through `rule`
//! (`OnDeny`, `KeySpaceFull`, `Lockout`, `LeasePolicy`, `QuotaChange`) and
//! `failure` (`FailureMode`, `BreakerConfig`); the others are
//! crate-private.

#[cfg(feature = "redis")]
mod cause;
mod control;
mod deny;
mod failure;
#[cfg(feature = "redis")]
mod lease;
mod quota_change;

pub(crate) use control::ControlOp;
pub use deny::{KeySpaceFull, Lockout, OnDeny};
pub(crate) use failure::FailurePolicy;
pub use failure::{BreakerConfig, FailureMode};
#[cfg(feature = "redis")]
pub use lease::LeasePolicy;
pub use quota_change::QuotaChange;
#[cfg(feature = "redis")]
pub(crate) use {
    cause::Cause,
    lease::{GlobalOptions, flow},
};
