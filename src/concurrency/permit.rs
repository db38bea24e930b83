//! A held slot, what an acquire decided, and the per-key counts of this
//! process that every slot is counted in.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use crate::util::now_or_later::NowOrLater;
use crate::{decision::Source, key::Key};

/// A held slot; dropping it frees the slot, whatever ends the request.
pub(crate) struct Permit {
    pub(super) _local: LocalPermit,
    /// The Redis slot ([`Slot`](super::slot::Slot)), released on drop;
    /// opaque so that the permit does not depend on the slot's module.
    #[cfg(feature = "redis")]
    pub(super) _slot: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// What an acquire decided, and who decided it.
pub(crate) struct Acquired {
    pub(crate) source: Source,
    /// The permit and the count with it, or the refusal.
    pub(crate) verdict: Result<(Permit, u32), Refused>,
}

pub(crate) struct Refused {
    pub(crate) retry_after: Duration,
}

/// Only a Redis acquire awaits.
pub(crate) type Acquire = NowOrLater<Acquired>;

pub(super) fn local_only(local: LocalPermit) -> Permit {
    Permit {
        _local: local,
        #[cfg(feature = "redis")]
        _slot: None,
    }
}

/// Per-key counts of requests in flight. A key is removed when its last
/// request ends, so memory is bounded by what is in flight, with no sweep.
#[derive(Default)]
pub(crate) struct LocalSlots {
    pub(super) counts: DashMap<Key, u32>,
}

/// A slot in [`LocalSlots`], freed on drop.
pub(super) struct LocalPermit {
    slots: Arc<LocalSlots>,
    key: Key,
}

impl Drop for LocalPermit {
    fn drop(&mut self) {
        self.slots.release(&self.key);
    }
}

impl LocalSlots {
    pub(super) fn try_acquire(
        self: &Arc<Self>,
        key: Key,
        limit: u32,
        retry_after: Duration,
    ) -> Result<(Permit, u32), Refused> {
        let held = self
            .count(&key, limit)
            .map_err(|_| Refused { retry_after })?;
        let permit = LocalPermit {
            slots: self.clone(),
            key,
        };
        Ok((local_only(permit), held))
    }

    /// Counts a request already admitted elsewhere.
    #[cfg(feature = "redis")]
    pub(super) fn take(self: &Arc<Self>, key: Key) -> LocalPermit {
        let _ = self.count(&key, u32::MAX);
        LocalPermit {
            slots: self.clone(),
            key,
        }
    }

    #[cfg(feature = "redis")]
    pub(super) fn held(&self, key: &Key) -> u32 {
        self.counts.get(key).map_or(0, |n| *n)
    }

    fn count(&self, key: &Key, limit: u32) -> Result<u32, u32> {
        // The entry holds its shard's lock: check and increment are one step.
        let mut n = self.counts.entry(key.clone()).or_insert(0);
        if *n >= limit {
            return Err(*n);
        }
        *n += 1;
        Ok(*n)
    }

    fn release(&self, key: &Key) {
        self.counts.remove_if_mut(key, |_, n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}
