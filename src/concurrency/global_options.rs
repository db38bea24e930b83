//! What a concurrency limit counted in Redis is built from, and the check
//! that turns it into the Redis backend.

use std::sync::Arc;
use std::time::Duration;

use super::slot_store::SlotStore;
use crate::backend::redis::RedisBackend;
use crate::engine::validate_global;
use crate::error::BuildError;
use crate::failure::Guard;
use crate::policy::FailurePolicy;
use crate::settings::Settings;

/// What [`ConcurrencyLimitBuilder::global`] and its companions set.
#[derive(Debug)]
pub(super) struct SlotOptions {
    pub(super) redis: Option<RedisBackend>,
    pub(super) slot_ttl: Duration,
    pub(super) failure: FailurePolicy,
}

impl Default for SlotOptions {
    fn default() -> Self {
        Self {
            redis: None,
            slot_ttl: Duration::from_secs(30),
            failure: FailurePolicy::default(),
        }
    }
}

impl SlotOptions {
    /// The local slot store, or the Redis one once its settings check out.
    pub(super) fn slot_store(
        self,
        name: &Arc<str>,
        settings: &Settings,
    ) -> Result<SlotStore, BuildError> {
        let Some(redis) = self.redis else {
            return Ok(SlotStore::local());
        };
        validate_global(name, &self.failure, &redis, settings.instances)?;
        BuildError::invalid_if(
            self.slot_ttl < Duration::from_millis(10),
            "slot_ttl must be at least 10 ms",
        )?;
        // The fallback is the local backend's own count, not the guard's
        // rate store.
        let live = redis.live_count();
        let guard = Guard::new(name.clone(), self.failure, settings.instances(), live);
        Ok(SlotStore::redis(redis, guard, self.slot_ttl))
    }
}
