//! A store that replaces another in a reload (ADR 24): until the reload has
//! carried every key over, a key the new store meets for the first time
//! starts from what the old store holds for it, converted. The old rules
//! stop deciding at the swap, so what a key inherits counts every request
//! they decided, however long the reload took.

use std::sync::{PoisonError, RwLock};

use crate::key::Key;

type From<T> = Box<dyn Fn(&Key, T) -> T + Send + Sync>;

/// What a new key starts from: read only when a key is inserted, never on
/// a known key's path.
pub(crate) struct Inherit<T>(RwLock<Option<From<T>>>);

impl<T> std::fmt::Debug for Inherit<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_tuple("Inherit").field(&on).finish()
    }
}

impl<T: Copy> Inherit<T> {
    pub(crate) const fn none() -> Self {
        Self(RwLock::new(None))
    }

    /// New keys start from `from(key, fresh)` until [`clear`](Self::clear).
    pub(crate) fn set(&self, from: impl Fn(&Key, T) -> T + Send + Sync + 'static) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(from));
    }

    /// Every key has been carried over: new keys start `fresh` again, and
    /// the old store can go.
    pub(crate) fn clear(&self) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// What `key` starts from: `fresh`, unless it inherits.
    pub(crate) fn start(&self, key: &Key, fresh: T) -> T {
        match &*self.0.read().unwrap_or_else(PoisonError::into_inner) {
            Some(from) => from(key, fresh),
            None => fresh,
        }
    }
}
