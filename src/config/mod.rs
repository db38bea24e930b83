#![doc = include_str!("../../docs/config.md")]
#![cfg_attr(feature = "redis", doc = include_str!("../../docs/config_redis.md"))]

// The file format, and the values in it that are checked while reading.
mod parse;
mod schema;
// The checks across a rule's fields, also while reading.
mod check;
// What went wrong, and where.
mod error;
// What code supplies by name.
mod registry;
// Text or a file into a `RulesConfig`.
mod read;
// A `RulesConfig` into rules and a layer.
mod build;
// `[[bandwidth]]` entries into bandwidth layers.
mod bandwidth;
mod locate;
// Reloading a file on change, and what any reload keeps and counts.
mod reload;
mod watch;

#[cfg(test)]
mod tests;

pub use error::ConfigError;
pub use registry::Registry;
pub use reload::{ConfigWatcher, Reloads};
pub use schema::RulesConfig;
