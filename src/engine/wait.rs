//! The queues of `OnDeny::Wait`: how many requests of a key wait at once.

use std::sync::Arc;

use crate::key::Key;

/// Requests waiting per key; a key is removed when its last waiter leaves.
#[derive(Default)]
pub(super) struct Waiters(dashmap::DashMap<Key, u32>);

/// One waiter's place; dropping it (the request went on, or its client went
/// away) frees the place.
pub(super) struct Place {
    waiters: Arc<Waiters>,
    key: Key,
}

impl Waiters {
    pub(super) fn enter(self: &Arc<Self>, key: Key, queue: u32) -> Option<Place> {
        let mut n = self.0.entry(key.clone()).or_insert(0);
        if *n >= queue {
            return None;
        }
        *n += 1;
        drop(n);
        Some(Place {
            waiters: self.clone(),
            key,
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.waiters.0.remove_if_mut(&self.key, |_, n| {
            *n -= 1;
            *n == 0
        });
    }
}
