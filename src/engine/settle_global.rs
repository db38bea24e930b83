//! A global rule's operations outside a decision (feature `redis`): the
//! control handle's, a read for an any-of group's headers, and the
//! settlement of what a request spent, each one `control.lua` call that
//! converts and follows the key as a decision does.

use super::control::ControlError;
use super::global::Global;
use crate::backend::redis::{RedisBackendError, Target};
use crate::decision::Decision;
use crate::failure::{Admit, FailureMode, PATIENCE};
use crate::key::Key;
use crate::observe;
use crate::policy::{Cause, ControlOp};
use crate::quota::Quota;
use crate::rule::Rule;

impl Global {
    /// The control handle's `op` in Redis; this gateway's deny cache
    /// forgets the key, so its next request asks Redis.
    pub(super) async fn control(
        &self,
        rule: &Rule,
        key: &Key,
        quota: Option<Quota>,
        op: ControlOp,
    ) -> Result<Option<Decision>, ControlError> {
        self.denies.forget(key);
        if let Some(leases) = &self.leases {
            leases.forget(key);
        }
        // Block and unblock touch only the lock, the rule and key's own; a
        // leased rule's state is counted in the lease's quota.
        let quota = self.counting(rule, quota.unwrap_or_else(|| Quota::per_second(1)));
        let call = self.control_call(rule, &quota, key, op);
        let patience = rule.failure.timeout.saturating_mul(PATIENCE);
        match tokio::time::timeout(patience, call).await {
            Ok(Ok((d, _))) => Ok(match op {
                ControlOp::Adjust(_) => {
                    self.learn(rule, key, &quota, &d);
                    Some(d)
                }
                ControlOp::Reset => {
                    self.learned.forget(key);
                    None
                }
                ControlOp::Block(_)
                | ControlOp::Unblock
                | ControlOp::GiveBack(..)
                | ControlOp::Refund(..) => None,
            }),
            Ok(Err(e)) => Err(ControlError::Redis(e)),
            Err(_) => Err(ControlError::Timeout(patience)),
        }
    }

    /// What a request of one unit would be told now, read from Redis
    /// without spending: for an any-of group's headers. `None` while the
    /// breaker is open or when Redis does not answer within the rule's
    /// timeout; nothing is counted against the breaker.
    pub(super) async fn read(&self, rule: &Rule, key: &Key, quota: Quota) -> Option<Decision> {
        if self.breaker_status().state != crate::failure::BreakerState::Closed {
            return None;
        }
        let quota = self.counting(rule, quota);
        let call = self.control_call(rule, &quota, key, ControlOp::Adjust(0));
        let (d, _) = tokio::time::timeout(rule.failure.timeout, call)
            .await
            .ok()?
            .ok()?;
        Some(d)
    }

    /// `op` on `key` in `quota`, converting the key from the rule's
    /// previous quotas first, as a decision would.
    async fn control_call(
        &self,
        rule: &Rule,
        quota: &Quota,
        key: &Key,
        op: ControlOp,
    ) -> Result<(Decision, bool), RedisBackendError> {
        self.know_fleet(rule).await;
        let target = Target::unlocked(&rule.name, rule.algorithm, quota);
        let previous = self.previous(*quota);
        self.redis
            .control(target, key, op, (self.fixed, previous))
            .await
    }

    /// Gives back (`units < 0`) or charges units a request spent in Redis,
    /// after its response (or its refusal) is out: one `control.lua` call
    /// behind the rule's breaker and timeout. A refund of a charge whose
    /// window ends `ends_in` ms from now is void when that window is no
    /// longer the current one (`outcome="refund_void"`). A failure is logged and counted
    /// (`outcome="settle_failed"`); a charge then lands in this instance's
    /// share under `LocalFallback`, and is dropped otherwise.
    pub(super) async fn adjust_redis(
        &self,
        rule: &Rule,
        key: &Key,
        quota: Quota,
        units: i64,
        ends_in: Option<i64>,
    ) {
        let counted = self.counting(rule, quota);
        if units < 0 {
            // A cached deny may no longer hold.
            self.denies.forget(key);
        }
        let cause = match self.guard.admit() {
            Admit::Skip(_) => Cause::CircuitOpen,
            Admit::Call | Admit::Probe => {
                let call = self.control_call(rule, &counted, key, settlement(units, ends_in));
                match self
                    .guard
                    .call(self.redis.reachability(), std::pin::pin!(call))
                    .await
                {
                    Ok((d, void)) => {
                        if void {
                            observe::refund_void(&rule.name);
                        }
                        return self.learn(rule, key, &counted, &d);
                    }
                    Err(cause) => cause,
                }
            }
        };
        self.guard.failed(&cause);
        let fallback = units > 0 && rule.failure.mode == FailureMode::LocalFallback;
        if fallback {
            self.adjust_fallback(key, quota, units);
        }
        observe::settle_failed(
            &rule.name,
            || key.fingerprint(),
            units,
            &cause,
            fallback,
            &self.settle_log,
        );
    }
}

/// The `control.lua` operation that settles `units` (`< 0`: given back):
/// a refund to the window the charge names (ending `ends_in` ms from now;
/// void once it has passed), otherwise an adjustment.
fn settlement(units: i64, ends_in: Option<i64>) -> ControlOp {
    match ends_in {
        Some(ends_in) if units < 0 => {
            let back = u32::try_from(units.unsigned_abs()).unwrap_or(u32::MAX);
            ControlOp::Refund(back, ends_in)
        }
        _ => ControlOp::Adjust(units),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_give_back_of_a_windowed_charge_is_a_refund_to_that_window() {
        assert!(matches!(
            settlement(-5, Some(300)),
            ControlOp::Refund(5, 300)
        ));
        // More than a script counts: all of it, never a wrapped number.
        let huge = settlement(i64::MIN, Some(1));
        assert!(matches!(huge, ControlOp::Refund(u32::MAX, 1)));
    }

    #[test]
    fn a_charge_or_a_give_back_with_no_window_adjusts_the_current_state() {
        assert!(matches!(settlement(-5, None), ControlOp::Adjust(-5)));
        assert!(matches!(settlement(7, Some(300)), ControlOp::Adjust(7)));
        assert!(matches!(settlement(7, None), ControlOp::Adjust(7)));
    }
}
