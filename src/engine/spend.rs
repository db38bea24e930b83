//! What a request's rules spent, given back when a later rule refuses it
//! and settled on the response by `count_if` and `cost_from_response`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rule::{CompiledRule, Store};
use crate::{decision::Source, key::Key, observe, quota::Quota};

/// Units one rule spent for a request: given back when a later rule
/// refuses the request, settled on the response by a `count_if` or
/// `cost_from_response` rule.
pub(crate) struct Spend {
    pub(super) rule: Arc<CompiledRule>,
    /// Bounded, as the store keeps it.
    pub(super) key: Key,
    pub(super) quota: Quota,
    pub(super) cost: u32,
    // Where it was spent: only global rules have a choice.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) source: Source,
    /// When a windowed rule (a window algorithm, a calendar quota) spent
    /// it, and the decision's reset then: a refund after its window ended
    /// is void.
    pub(super) charged: Option<(Instant, Duration)>,
}

/// What the rules of one request spent so far. Dropped while the request
/// is still being decided (its client went away during an await), it gives
/// everything back: the service was never called.
#[derive(Default)]
pub(crate) struct Spends(pub(super) Vec<Spend>);

impl Spends {
    /// Gives every unit back now: a later rule refused the request.
    pub(super) fn refund(&mut self) {
        for s in self.0.drain(..) {
            s.rule.adjust_spent(&s, -i64::from(s.cost));
        }
    }

    /// An allowed request: the spends of the rules that settle on the
    /// response go with it; the others stay spent.
    #[inline(never)]
    pub(super) fn into_settlement(mut self) -> Option<Box<Settlement>> {
        let mut kept = std::mem::take(&mut self.0);
        kept.retain(|s| s.rule.rule.settles());
        (!kept.is_empty()).then(|| Box::new(Settlement(kept)))
    }
}

impl Drop for Spends {
    #[inline]
    fn drop(&mut self) {
        // Most requests record nothing: no drain to set up.
        if !self.0.is_empty() {
            self.refund();
        }
    }
}

/// The spends of the rules that settle on the response. Dropped unsettled
/// (no response head came: the client went away, the service failed),
/// they stay spent: the handler may have done its work.
pub(crate) struct Settlement(Vec<Spend>);

impl Settlement {
    /// Keeps, gives back or charges more of each reserved cost, as the
    /// rules' closures read `res`. A panicking closure keeps the
    /// reservation; nothing is locked while it runs.
    pub(crate) fn settle(self, res: &http::response::Parts) {
        for s in self.0 {
            let rule = &s.rule.rule;
            let misuse = &s.rule.misuse_log;
            let call = |what: &'static str, f: &dyn Fn() -> u32| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|_| {
                    if let Some(suppressed) = misuse.take(observe::DENY_EVERY) {
                        tracing::error!(target: observe::TARGET, rule = %rule.name, what, suppressed, "closure panicked; the request keeps its reserved cost");
                    }
                })
            };
            if let Some(f) = &rule.accounting.count_if {
                match call("count_if", &|| u32::from(f(res))) {
                    Ok(0) => {
                        s.rule.adjust_spent(&s, -i64::from(s.cost));
                        continue;
                    }
                    Ok(_) => {}
                    Err(()) => continue,
                }
            }
            if let Some(f) = &rule.accounting.cost_from_response
                && let Ok(actual) = call("cost_from_response", &|| f(res))
            {
                let delta = i64::from(actual) - i64::from(s.cost);
                if delta != 0 {
                    s.rule.adjust_spent(&s, delta);
                }
            }
        }
    }
}

impl CompiledRule {
    /// Spends (`units > 0`) or gives back what `s` spent, where it spent
    /// it. Never fails the request: a Redis failure is logged.
    pub(super) fn adjust_spent(self: &Arc<Self>, s: &Spend, units: i64) {
        match &self.store {
            Store::Local(store) => {
                if units < 0 && s.charged.is_some_and(|(at, _)| window_ended(&s.quota, at)) {
                    observe::refund_void(&self.rule.name);
                    return;
                }
                store.adjust(&s.key, s.quota, units);
            }
            #[cfg(feature = "redis")]
            Store::Global(g) => match s.source {
                Source::Fallback => g.adjust_fallback(&s.key, s.quota, units),
                Source::Leased => g.adjust_lease(&self.rule, &s.key, s.quota, units),
                // Off the request path: the response (or the 429) is out.
                Source::Global => {
                    if let Ok(rt) = tokio::runtime::Handle::try_current() {
                        let (g, this, key, quota) =
                            (g.clone(), self.clone(), s.key.clone(), s.quota);
                        // The charge's window, as the script told its end.
                        let ends_in = s.charged.map(|(at, reset)| {
                            let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                            ms(reset) - ms(at.elapsed())
                        });
                        rt.spawn(async move {
                            g.adjust_redis(&this.rule, &key, quota, units, ends_in)
                                .await
                        });
                    }
                }
                _ => {}
            },
        }
    }
}

/// Whether the calendar window `quota` counted a charge made at `at` in
/// has ended (a local rule's rolling quotas have no windows).
fn window_ended(quota: &Quota, at: Instant) -> bool {
    let now = crate::util::instant::unix_us();
    let elapsed = i64::try_from(at.elapsed().as_micros()).unwrap_or(i64::MAX);
    quota
        .window_secs(now.div_euclid(1_000_000))
        .is_some_and(|(start, _)| now.saturating_sub(elapsed) < start.saturating_mul(1_000_000))
}
