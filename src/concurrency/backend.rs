//! Where in-flight counts live.

use std::sync::Arc;

use dashmap::DashMap;

use crate::Key;

/// The store of in-flight counts. An enum rather than a trait object so the
/// hot path is a plain match; a Redis lease backend (`lease.lua`) becomes a
/// second variant whose acquire is async (sorted-set leases with a TTL on
/// Redis TIME, see `lease.lua` beside this file), like the rule chain's
/// pending steps.
#[derive(Clone)]
pub(crate) enum Backend {
    Local(Arc<LocalSlots>),
}

/// A held slot; dropping it frees the slot, whatever ends the request.
pub(crate) enum Permit {
    Local { slots: Arc<LocalSlots>, key: Key },
}

impl Drop for Permit {
    fn drop(&mut self) {
        match self {
            Self::Local { slots, key } => slots.release(key),
        }
    }
}

impl Backend {
    pub(crate) fn local() -> Self {
        Self::Local(Arc::new(LocalSlots::default()))
    }

    /// Takes a slot when fewer than `limit` are held: the permit and the
    /// count with it, or the count that refused it.
    pub(crate) fn try_acquire(&self, key: Key, limit: u32) -> Result<(Permit, u32), u32> {
        match self {
            Self::Local(slots) => {
                let held = slots.try_acquire(&key, limit)?;
                let permit = Permit::Local {
                    slots: slots.clone(),
                    key,
                };
                Ok((permit, held))
            }
        }
    }

    pub(crate) fn in_flight(&self, key: &Key) -> u32 {
        match self {
            Self::Local(slots) => slots.counts.get(key).map_or(0, |n| *n),
        }
    }

    pub(crate) fn keys(&self) -> usize {
        match self {
            Self::Local(slots) => slots.counts.len(),
        }
    }
}

/// Per-key counts of requests in flight. A key is removed when its last
/// request ends, so memory is bounded by what is in flight, with no sweep.
#[derive(Default)]
pub(crate) struct LocalSlots {
    counts: DashMap<Key, u32>,
}

impl LocalSlots {
    fn try_acquire(&self, key: &Key, limit: u32) -> Result<u32, u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_forgets_idle_keys() {
        let b = Backend::local();
        let k = Key::from("acct");
        let (p1, n1) = b.try_acquire(k.clone(), 2).unwrap();
        let (p2, n2) = b.try_acquire(k.clone(), 2).unwrap();
        assert_eq!((n1, n2), (1, 2));
        assert_eq!(b.try_acquire(k.clone(), 2).err(), Some(2));
        let (_other, _) = b.try_acquire(Key::from("other"), 2).unwrap();
        assert_eq!(b.keys(), 2);
        drop(p1);
        assert_eq!(b.in_flight(&k), 1);
        let (p3, n3) = b.try_acquire(k.clone(), 2).unwrap();
        assert_eq!(n3, 2);
        drop((p2, p3));
        assert_eq!(b.in_flight(&k), 0);
        assert_eq!(b.keys(), 1, "an idle key is removed");
    }
}
