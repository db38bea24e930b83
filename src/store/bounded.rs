//! A map by key within a rule's key budget: the stores a global rule keeps
//! beside Redis (cached denies, Redis's last answers) share its
//! bookkeeping. When full, a new key first makes room by forgetting the
//! entries its store says may go (at most one sweep per
//! [`SWEEP_EVERY`](super::keyspace::SWEEP_EVERY)); if none may, it is not
//! stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;
use dashmap::mapref::one::RefMut;

use super::keyspace::Budget;
use crate::key::Key;
use crate::util::throttle::Throttle;

#[derive(Debug)]
pub(crate) struct BoundedMap<V> {
    map: DashMap<Key, V>,
    /// Entries held, counted after each insert and removal: zero means
    /// none but those being inserted meanwhile, so a lookup may be skipped
    /// (a DashMap's own length locks every shard).
    held: AtomicUsize,
    budget: Arc<Budget>,
    sweeps: Throttle,
}

impl<V> BoundedMap<V> {
    pub(crate) fn new(budget: Arc<Budget>) -> Self {
        Self {
            map: DashMap::new(),
            held: AtomicUsize::new(0),
            budget,
            sweeps: Throttle::default(),
        }
    }

    /// Sets `key`'s entry; a new key takes a place, sweeping out the
    /// entries `keep` refuses when there is none. Clones the key only when
    /// it is new.
    pub(crate) fn put(&self, key: &Key, value: V, keep: impl FnMut(&V) -> bool) {
        if let Some(mut e) = self.map.get_mut(key) {
            *e = value;
            return;
        }
        let room = self
            .budget
            .take_or_sweep(&self.sweeps, || self.retain(keep));
        if !room {
            return;
        }
        match self.map.insert(key.clone(), value) {
            // Another request stored it meanwhile.
            Some(_) => self.budget.give_back(1),
            None => drop(self.held.fetch_add(1, Ordering::Release)),
        }
    }

    /// Whether no entry is held, but maybe one being inserted meanwhile:
    /// a store that holds nothing, most of them most of the time, is then
    /// neither hashed into nor locked.
    fn is_empty(&self) -> bool {
        self.held.load(Ordering::Acquire) == 0
    }

    pub(crate) fn get_mut(&self, key: &Key) -> Option<RefMut<'_, Key, V>> {
        if self.is_empty() {
            return None;
        }
        self.map.get_mut(key)
    }

    /// Removes `key`'s entry when `remove` says so (called under the
    /// entry's lock); whether it did.
    pub(crate) fn remove_if(&self, key: &Key, remove: impl FnOnce(&V) -> bool) -> bool {
        if self.is_empty() {
            return false;
        }
        let removed = self.map.remove_if(key, |_, v| remove(v)).is_some();
        if removed {
            self.held.fetch_sub(1, Ordering::Release);
            self.budget.give_back(1);
        }
        removed
    }

    pub(crate) fn remove(&self, key: &Key) {
        self.remove_if(key, |_| true);
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Forgets the entries `keep` refuses; how many.
    pub(crate) fn retain(&self, keep: impl FnMut(&V) -> bool) -> usize {
        let removed = self.budget.retain(&self.map, keep);
        self.held.fetch_sub(removed, Ordering::Release);
        removed
    }

    pub(crate) fn shrink_to_fit(&self) {
        self.map.shrink_to_fit();
    }
}
