//! Group commit for exact global rules (feature `redis`).
//!
//! While one request's script call is in flight for a rule's group (its
//! quota and, on a cluster, its keys' slot), later requests of that group,
//! any key, queue; when it returns, one script call decides the whole
//! queue, each (key, cost) in arrival order, as separate calls would have.
//! Each waiter gets its own decision. An idle gateway never waits: the
//! first request goes at once. A hot key, or many keys, then cost about
//! one call per round trip instead of one per request.

use std::hash::Hash;
use std::sync::Arc;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use tokio::sync::oneshot;

use crate::key::Key;

/// The queues of groups with a call in flight. A group is the rule's
/// quota and slot, never client input: foldhash (already governor's,
/// through hashbrown) instead of SipHash, which cost about 700
/// instructions a global decision for the two lookups.
pub(super) struct Queues<G, T> {
    map: DashMap<G, Batch<T>, foldhash::fast::RandomState>,
}

/// Requests queued behind a call: their keys and costs, in arrival order,
/// and where each one's answer goes.
pub(super) type Batch<T> = Vec<(Key, u32, oneshot::Sender<T>)>;

pub(super) enum Join<G: Eq + Hash, T> {
    /// No call in flight: make it, then drain the queue.
    Lead(Leader<G, T>),
    /// Wait for the answer. A closed channel means the leader went away
    /// before deciding this request: decide it alone.
    Wait(oneshot::Receiver<T>),
}

/// The request whose call is in flight for a group. Dropped, it ends the
/// queue: waiters not yet decided see a closed channel.
pub(super) struct Leader<G: Eq + Hash, T> {
    queues: Arc<Queues<G, T>>,
    group: G,
    /// The queue ended: the group's entry may be a later leader's.
    ended: bool,
}

impl<G: Eq + Hash + Clone, T> Queues<G, T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            map: DashMap::with_hasher(foldhash::fast::RandomState::default()),
        })
    }

    pub(super) fn join(self: &Arc<Self>, group: G, key: &Key, cost: u32) -> Join<G, T> {
        match self.map.entry(group) {
            Entry::Occupied(mut e) => {
                let (tx, rx) = oneshot::channel();
                e.get_mut().push((key.clone(), cost, tx));
                Join::Wait(rx)
            }
            Entry::Vacant(e) => {
                let group = e.key().clone();
                e.insert(Vec::new());
                Join::Lead(Leader {
                    queues: self.clone(),
                    group,
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

impl<G: Eq + Hash, T> Leader<G, T> {
    /// Up to `max` requests queued since the last call, or `None` when
    /// there are none, which ends the queue (atomically: a request arriving
    /// after leads its own).
    pub(super) fn next(&mut self, max: usize) -> Option<Batch<T>> {
        if self.ended {
            return None;
        }
        let emptied = self
            .queues
            .map
            .remove_if(&self.group, |_, queue| queue.is_empty());
        if emptied.is_some() {
            self.ended = true;
            return None;
        }
        let mut queue = self.queues.map.get_mut(&self.group)?;
        if queue.len() <= max {
            return Some(std::mem::take(&mut *queue));
        }
        let rest = queue.split_off(max);
        Some(std::mem::replace(&mut *queue, rest))
    }
}

impl<G: Eq + Hash, T> Drop for Leader<G, T> {
    fn drop(&mut self) {
        if !self.ended {
            self.queues.map.remove(&self.group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_leads_the_rest_queue_in_order_and_the_queue_ends_empty() {
        let q: Arc<Queues<u8, u32>> = Queues::new();
        let Join::Lead(mut leader) = q.join(1, &Key::from("a"), 1) else {
            panic!("the first leads")
        };
        // Any key of the group queues behind the call in flight.
        let waiters: Vec<_> = (2..6)
            .map(
                |cost| match q.join(1, &Key::from(format!("k{}", cost % 2)), cost) {
                    Join::Wait(rx) => rx,
                    Join::Lead(_) => panic!("later ones wait"),
                },
            )
            .collect();
        assert!(
            matches!(q.join(2, &Key::from("a"), 1), Join::Lead(_)),
            "another group leads its own"
        );
        let first = leader.next(3).unwrap();
        assert_eq!(
            first.iter().map(|(_, c, _)| *c).collect::<Vec<_>>(),
            [2, 3, 4],
            "at most max, in order"
        );
        assert_eq!(first[1].0, Key::from("k1"));
        let second = leader.next(3).unwrap();
        assert_eq!(second.len(), 1);
        for (_, cost, tx) in first.into_iter().chain(second) {
            tx.send(cost * 10).unwrap();
        }
        for (rx, want) in waiters.into_iter().zip([20, 30, 40, 50]) {
            assert_eq!(rx.await.unwrap(), want);
        }
        assert!(leader.next(3).is_none(), "nobody queued: the queue ends");
        assert!(matches!(q.join(1, &Key::from("a"), 1), Join::Lead(_)));
    }

    #[tokio::test]
    async fn a_leader_that_goes_away_closes_the_queue() {
        let q: Arc<Queues<u8, u32>> = Queues::new();
        let leader = q.join(1, &Key::from("k"), 1);
        let Join::Wait(rx) = q.join(1, &Key::from("other"), 1) else {
            panic!("waits")
        };
        drop(leader);
        assert!(rx.await.is_err());
        assert_eq!(q.len(), 0);
    }
}
