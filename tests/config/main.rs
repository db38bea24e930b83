//! Rules from TOML and YAML files, and live reload.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "metrics")]
mod reload;
#[cfg(feature = "redis")]
mod rules;
