//! Same-key coalescing for exact global rules (feature `redis`).
//!
//! While one request's script call for a key is in flight, later requests
//! for that key and quota queue; when it returns, one script call decides
//! the whole queue, each cost in turn, as separate calls would have. Each
//! waiter gets its own decision. A hot key then costs about one call per
//! round trip instead of one per request.

use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;

use crate::{Key, Quota};

/// The queues of keys with a call in flight, keyed by key.
pub(super) struct Queues<T> {
    map: DashMap<Key, Queue<T>>,
}

struct Queue<T> {
    quota: Quota,
    waiting: Vec<(u32, oneshot::Sender<T>)>,
}

/// Requests queued behind a call: their costs, in arrival order, and where
/// each one's answer goes.
pub(super) type Batch<T> = Vec<(u32, oneshot::Sender<T>)>;

pub(super) enum Join<T> {
    /// No call in flight: make it, then drain the queue.
    Lead(Leader<T>),
    /// Wait for the answer. A closed channel means the leader went away
    /// before deciding this request: decide it alone.
    Wait(oneshot::Receiver<T>),
    /// A call for another quota (a request-time quota) is in flight: not
    /// coalesced.
    Alone,
}

/// The request whose call is in flight for a key. Dropped, it ends the
/// queue: waiters not yet decided see a closed channel.
pub(super) struct Leader<T> {
    queues: Arc<Queues<T>>,
    key: Key,
    /// The queue ended: the key's entry may be a later leader's.
    ended: bool,
}

impl<T> Queues<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            map: DashMap::new(),
        })
    }

    pub(super) fn join(self: &Arc<Self>, key: &Key, quota: Quota, cost: u32) -> Join<T> {
        match self.map.entry(key.clone()) {
            Entry::Occupied(mut e) if e.get().quota == quota => {
                let (tx, rx) = oneshot::channel();
                e.get_mut().waiting.push((cost, tx));
                Join::Wait(rx)
            }
            Entry::Occupied(_) => Join::Alone,
            Entry::Vacant(e) => {
                e.insert(Queue {
                    quota,
                    waiting: Vec::new(),
                });
                Join::Lead(Leader {
                    queues: self.clone(),
                    key: key.clone(),
                    ended: false,
                })
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

impl<T> Leader<T> {
    /// The requests queued since the last call, or `None` when there are
    /// none, which ends the queue (atomically: a request arriving after
    /// leads its own).
    pub(super) fn next(&mut self) -> Option<Batch<T>> {
        if self.ended {
            return None;
        }
        let emptied = self
            .queues
            .map
            .remove_if(&self.key, |_, queue| queue.waiting.is_empty());
        if emptied.is_some() {
            self.ended = true;
            return None;
        }
        let mut queue = self.queues.map.get_mut(&self.key)?;
        Some(std::mem::take(&mut queue.waiting))
    }

    pub(super) fn key(&self) -> &Key {
        &self.key
    }
}

impl<T> Drop for Leader<T> {
    fn drop(&mut self) {
        if !self.ended {
            self.queues.map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_leads_the_rest_queue_in_order_and_the_queue_ends_empty() {
        let q: Arc<Queues<u32>> = Queues::new();
        let (k, quota) = (Key::from("k"), Quota::per_second(10));
        let Join::Lead(mut leader) = q.join(&k, quota, 1) else {
            panic!("the first leads")
        };
        let waiters: Vec<_> = (2..5)
            .map(|cost| match q.join(&k, quota, cost) {
                Join::Wait(rx) => rx,
                _ => panic!("later ones wait"),
            })
            .collect();
        assert!(matches!(q.join(&k, Quota::per_second(5), 1), Join::Alone));
        let batch = leader.next().unwrap();
        assert_eq!(batch.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [2, 3, 4]);
        for (cost, tx) in batch {
            tx.send(cost * 10).unwrap();
        }
        for (rx, want) in waiters.into_iter().zip([20, 30, 40]) {
            assert_eq!(rx.await.unwrap(), want);
        }
        assert!(leader.next().is_none(), "nobody queued: the queue ends");
        assert_eq!(q.len(), 0);
        assert!(matches!(q.join(&k, quota, 1), Join::Lead(_)));
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_closes_the_queue() {
        let q: Arc<Queues<u32>> = Queues::new();
        let (k, quota) = (Key::from("k"), Quota::per_second(10));
        let leader = q.join(&k, quota, 1);
        let Join::Wait(rx) = q.join(&k, quota, 1) else {
            panic!("waits")
        };
        drop(leader);
        assert!(rx.await.is_err());
        assert_eq!(q.len(), 0);
    }
}
