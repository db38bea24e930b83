//! A leasing rule's Redis part: grants, and the units given back.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::global::{Global, Quotas, return_unspent};
use crate::backend::redis::{Grant, LeaseAsk, Target};
use crate::failure::Admit;
use crate::policy::Cause;
use crate::rule::Rule;
use crate::store::leases::{Flight, Unspent};
use crate::store::lock::Locks;
use crate::{decision::Decision, decision::Source, key::Key, observe, quota::Quota};

impl Global {
    /// Asks Redis for a lease of `key`, for this request and the next.
    pub(super) async fn grant(
        self: &Arc<Self>,
        rule: &Rule,
        locks: &Locks,
        key: &Key,
        quotas: Quotas,
        cost: NonZeroU32,
        mut flight: Box<Flight>,
    ) -> (Decision, Source) {
        let Quotas {
            shown: quota,
            counted,
        } = quotas;
        if let Admit::Skip(_) = self.guard.admit() {
            flight.failed();
            return self.fail(locks, key, quota, cost, Cause::CircuitOpen);
        }
        // Given back in the grant call, unless counted in another quota.
        let back = match flight.unspent.take() {
            Some(unspent) if unspent.counted == counted => (unspent.units(), unspent.window),
            Some(unspent) => {
                self.give_back(rule, unspent);
                (0, None)
            }
            None => (0, None),
        };
        let ttl = self
            .leases
            .as_ref()
            .map_or(Duration::ZERO, |l| l.policy().ttl());
        let asked = Instant::now();
        // A key too slow for more than this request's units: the rate
        // script, lighter than a grant that keeps the holders, and committed
        // with the rule's other such requests when it coalesces.
        let asked_for = if back.0 == 0 && flight.want <= cost.get() {
            self.call_exact(rule, key, counted, cost).await.map(|d| {
                let d = d.decision;
                Grant {
                    granted: if d.is_allowed() { cost.get() } else { 0 },
                    remaining: d.remaining(),
                    wait: d.retry_after().unwrap_or_default(),
                    reset: d.reset(),
                    lease: ttl,
                    window: None,
                }
            })
        } else {
            let target = Target::unlocked(&rule.name, rule.algorithm, &counted);
            let ask = LeaseAsk {
                need: flight.need,
                want: flight.want,
                holder: &self.holder,
                lease: ttl,
                back,
            };
            self.know_fleet(rule).await;
            let call = self.redis.grant(target, key, ask, self.previous(counted));
            let granted = self
                .guard
                .call(self.redis.reachability(), std::pin::pin!(call))
                .await;
            if let Ok(g) = &granted {
                self.remember(rule, key, &counted, g.remaining, g.reset);
            }
            granted
        };
        match asked_for {
            Ok(g) if g.granted > 0 => {
                // A window lease that ends before its window does: what it
                // has left goes back when it ends, while the window still
                // counts it, not at the next ask or sweep (a quiet gateway
                // would strand it).
                if g.window.is_some() && g.lease >= ttl {
                    self.give_back_at(rule, key, asked, g.lease);
                }
                let d = flight.granted(counted, quota, cost.get(), asked, &g);
                (d, Source::Leased)
            }
            Ok(g) => {
                let wait = g.wait.max(Duration::from_millis(1));
                let d = Decision::denied(quota.limit(), quota.window(), wait, g.reset);
                flight.denied(counted, d);
                (d, Source::Global)
            }
            Err(cause) => {
                flight.failed();
                self.fail(locks, key, quota, cost, cause)
            }
        }
    }

    /// Returns a lease's unspent units to Redis, off the request path; a
    /// failure only leaves them unused.
    pub(super) fn give_back(self: &Arc<Self>, rule: &Rule, unspent: Unspent) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, name, algorithm) = (self.clone(), rule.name.clone(), rule.algorithm);
        rt.spawn(async move { this.send_back(&name, algorithm, &unspent).await });
    }

    /// [`give_back`](Self::give_back)'s call, behind the rule's breaker.
    async fn send_back(
        &self,
        name: &str,
        algorithm: crate::algorithm::Algorithm,
        unspent: &Unspent,
    ) {
        let call = return_unspent(&self.redis, name, algorithm, unspent);
        if let Err(cause) = self
            .guard
            .call(self.redis.reachability(), std::pin::pin!(call))
            .await
        {
            tracing::debug!(target: observe::TARGET, rule = %name, %cause, "could not give back a lease's unspent units");
        }
    }

    /// Gives back what `key`'s lease asked for at `asked` has left when it
    /// ends, `lease` later, unless another has taken its place.
    fn give_back_at(self: &Arc<Self>, rule: &Rule, key: &Key, asked: Instant, lease: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (this, key) = (self.clone(), key.clone());
        let (name, algorithm) = (rule.name.clone(), rule.algorithm);
        rt.spawn(async move {
            tokio::time::sleep_until(crate::util::instant::after(asked, lease).into()).await;
            let ended = this.leases.as_ref().and_then(|l| l.ended(&key, asked));
            if let Some(unspent) = ended {
                this.send_back(&name, algorithm, &unspent).await;
            }
        });
    }

    /// Units a leased request spent: given back to (or charged on) its
    /// lease while it lasts; what the lease cannot take of a charge goes
    /// to Redis.
    pub(super) fn adjust_lease(self: &Arc<Self>, rule: &Rule, key: &Key, quota: Quota, units: i64) {
        let (Some(leases), Some(counted)) = (&self.leases, self.counted(rule, quota)) else {
            return;
        };
        let rest = leases.adjust(key, counted, units);
        if rest > 0
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (this, rule, key) = (self.clone(), rule.clone(), key.clone());
            rt.spawn(async move { this.adjust_redis(&rule, &key, quota, rest, None).await });
        }
    }
}
