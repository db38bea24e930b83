//! A global rule's decisions without Redis: its failure mode, and the
//! local fallback, which starts each key from what Redis last answered
//! for it.

use std::num::NonZeroU32;
use std::time::Duration;

use super::global::Global;
use crate::failure::FailureMode;
use crate::policy::Cause;
use crate::rule::Rule;
use crate::store::lock::Locks;
use crate::{decision::Decision, decision::Source, key::Key, quota::Quota};

impl Global {
    /// Decides without Redis, through the guard, which says so loudly. A
    /// lock learned from Redis holds to its end whatever the failure mode.
    pub(super) fn fail(
        &self,
        locks: &Locks,
        key: &Key,
        quota: Quota,
        cost: NonZeroU32,
        cause: Cause,
    ) -> (Decision, Source) {
        if let Some(left) = locks.held(key) {
            self.guard.failed(&cause);
            let d = Decision::denied(quota.limit(), quota.window(), left, left);
            return (d, Source::Locked);
        }
        let guard = &self.guard;
        guard.fail_with(key, cause, |mode| {
            let closed = |q: Quota| {
                Decision::denied(q.limit(), q.window(), guard.closed_retry(), q.window())
            };
            let decision = match mode {
                FailureMode::FailClosed => closed(quota),
                FailureMode::RefusePercent(p) if guard.partial_refuses(p) => closed(quota),
                FailureMode::FailOpen | FailureMode::RefusePercent(_) => {
                    Decision::allowed(quota.limit(), quota.window(), quota.burst(), Duration::ZERO)
                }
                // A cost the share can't hold waits for Redis, not a local bucket.
                FailureMode::LocalFallback => {
                    let share = guard.share(quota);
                    if cost.get() > share.burst() {
                        closed(share)
                    } else {
                        self.recall(key, share);
                        // A diverted key is counted (or refused) in the share, unreported.
                        self.fallback.check(key, share, cost).0
                    }
                }
            };
            let allowed = decision.is_allowed();
            (decision, allowed)
        })
    }

    /// Starts `key`'s fallback `share` from what Redis last answered for
    /// it, once per answer: its usage then, less what the share has given
    /// back since, unless the share already counts more (what the fallback
    /// admitted after that answer is not in it). A key Redis never
    /// answered for keeps its share.
    fn recall(&self, key: &Key, share: Quota) {
        self.learned.take(key, share, |used| {
            let held = share
                .burst()
                .saturating_sub(self.fallback.adjust(key, share, 0).remaining());
            if used > held {
                self.fallback.adjust(key, share, i64::from(used - held));
            }
        });
    }

    /// Remembers Redis's answer `d` for `key` in `quota` (as Redis counts
    /// it), for the fallback; not a cost that never fits, which says
    /// nothing of the key.
    pub(super) fn learn(&self, rule: &Rule, key: &Key, quota: &Quota, d: &Decision) {
        if d.is_allowed() || d.retry_after().is_some() {
            self.remember(rule, key, quota, d.remaining(), d.reset());
        }
    }

    /// Records `remaining` units of `key`, whole again after `reset`, when
    /// the rule falls back locally (no other mode reads it).
    pub(super) fn remember(
        &self,
        rule: &Rule,
        key: &Key,
        quota: &Quota,
        remaining: u32,
        reset: Duration,
    ) {
        if rule.failure.mode == FailureMode::LocalFallback {
            self.learned
                .put(key, rule.algorithm, quota, remaining, reset);
        }
    }

    /// Units a request spent while the failure mode decided: in this
    /// instance's share.
    pub(super) fn adjust_fallback(&self, key: &Key, quota: Quota, units: i64) {
        self.fallback.adjust(key, self.guard.share(quota), units);
    }
}
