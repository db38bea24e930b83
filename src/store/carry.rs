//! What a local store carries over from the one it replaces: in a reload
//! (converted to the new quota, ADR 24) and from a snapshot.

use std::sync::Arc;

use super::local::{Forward, LocalStore};
use crate::policy::QuotaChange;
use crate::{key::Key, quota::Quota};

impl LocalStore {
    /// From now on, what the rules of `old` (which this store replaces)
    /// decide is decided here: `cost` converted, in this store's `to`.
    pub(crate) fn succeed(self: &Arc<Self>, old: &Self, from: Quota, to: Quota, how: QuotaChange) {
        let _ = old
            .forward
            .set(Forward::new(Arc::downgrade(self), (from, to), how));
    }

    /// Makes this store, which replaces `old` in a reload, start each new
    /// key from what it used under `from` in `old`, converted to `to` as
    /// `how` says: between rolling quotas, or calendar quotas of the same
    /// windows (period, offset and aligned length; anything else starts
    /// afresh). Lasts until
    /// [`adopt_all`](Self::adopt_all): requests that the old rules decide
    /// meanwhile count.
    pub(crate) fn inherit_from(
        self: &Arc<Self>,
        old: &Arc<Self>,
        from: Quota,
        to: Quota,
        how: QuotaChange,
    ) {
        if let (Some((_, _, l)), Some(_)) = (&self.fixed, &old.fixed) {
            if from.period().is_none() {
                let old = old.clone();
                l.state.inherit.set(move |key, _| {
                    let used = old
                        .fixed
                        .as_ref()
                        .map_or(0.0, |(_, _, o)| o.state.used_of(key));
                    converted_used(used, from, to, how)
                        .unwrap_or(0.0)
                        .clamp(0.0, f64::from(to.burst()))
                });
            }
        } else if from.same_windows(&to) {
            let old = old.clone();
            self.calendar().inherit(move |key, window| {
                let count = old.calendar.get().map_or(0, |c| c.count_in(key, window));
                converted_count(count, from, to, how).unwrap_or(0)
            });
        }
    }
}

impl<C: governor::clock::Clock + Clone> LocalStore<C> {
    /// Carries over every key of `old` that no request has carried yet, then
    /// stops inheriting: `old` can go.
    pub(crate) fn adopt_all(&self, old: &Self, to: Quota) {
        if let Some((_, _, l)) = &self.fixed {
            for (key, _) in old.used() {
                l.state.adopt(&key);
            }
            l.state.inherit.clear();
        }
        if let Some(c) = self.calendar.get() {
            for (key, _, _) in old.calendar_counts() {
                c.adopt(&key, to);
            }
            c.settled();
        }
    }

    /// Sets `key` of the static rolling quota `to` to the `used` units it
    /// had under `from`: as they are when the quota is the same, else as
    /// `how` converts them. Nothing when `to` is not this store's rolling
    /// quota.
    pub(crate) fn carry_used(&self, key: Key, used: f64, from: Quota, to: Quota, how: QuotaChange) {
        let Some((_, _, l)) = &self.fixed else { return };
        if let Some(u) = converted_used(used, from, to, how).filter(|u| *u > 0.0) {
            l.state.put_used(key, u, to.burst());
        }
    }

    /// Adds to `key`'s count in the current window of the calendar quota
    /// `to` what it counted under `from`, converted as `how` says.
    pub(crate) fn carry_count(
        &self,
        key: &Key,
        count: u32,
        from: Quota,
        to: Quota,
        how: QuotaChange,
    ) {
        if let Some(n) = converted_count(count, from, to, how).filter(|n| *n >= 1) {
            self.calendar().adjust(key, to, i64::from(n));
        }
    }
}

/// The `used` units of the rolling quota `from` under the rolling quota
/// `to`: as they are when both count alike, else as `how` converts them.
/// `None` when one is a calendar quota.
fn converted_used(used: f64, from: Quota, to: Quota, how: QuotaChange) -> Option<f64> {
    if to.period().is_some() || from.period().is_some() {
        None
    } else if same_size(from, to) {
        Some(used)
    } else {
        how.convert(used, f64::from(from.burst()), f64::from(to.burst()))
    }
}

/// A calendar `count` of `from` under `to`, converted as `how` says when
/// the limit changed (rounded up: a conversion never hands out a unit).
/// `None` between calendars of other windows.
fn converted_count(count: u32, from: Quota, to: Quota, how: QuotaChange) -> Option<u32> {
    if !from.same_windows(&to) {
        None
    } else if from.limit() == to.limit() {
        Some(count)
    } else {
        let n = how.convert(
            f64::from(count),
            f64::from(from.limit()),
            f64::from(to.limit()),
        )?;
        Some(n.ceil().min(f64::from(u32::MAX)) as u32)
    }
}

/// Whether two rolling quotas count alike: a state under one reads the
/// same under the other.
fn same_size(a: Quota, b: Quota) -> bool {
    (a.limit(), a.window(), a.burst()) == (b.limit(), b.window(), b.burst())
}
