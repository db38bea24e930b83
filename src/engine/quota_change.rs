//! A global rule after a reload changed its quota (ADR 21): which previous
//! quota its calls convert from, and for how long. Redis converts each key
//! in the script; local rules convert in `rule`.

use std::time::{Duration, Instant};

use super::global::Global;
use crate::Quota;
use crate::policy::QuotaChange;
use crate::rule::Rule;

impl Global {
    /// After a reload that changed `rule`'s static quota from `old`: keys
    /// convert their old state at their next decision, while it may exist.
    pub(super) fn converting_from(&self, rule: &Rule, old: Quota) {
        let Some(new) = rule.static_quota() else {
            return;
        };
        let (old, new) = (self.counting(rule, old), self.counting(rule, new));
        // The longest an old state lives: a whole bucket refilling, or two
        // windows for the sliding window. Saturating: a quota may span years.
        let refill = old.window().as_secs_f64() * f64::from(old.burst()) / f64::from(old.limit());
        let refill = Duration::try_from_secs_f64(refill).unwrap_or(Duration::MAX);
        let lasts = refill.max(old.window()).saturating_mul(2);
        let until = crate::instant::after(Instant::now(), lasts);
        let _ = self.previous.set((old, new, rule.on_quota_change, until));
    }

    /// The previous quota a decision of `quota` converts from, if any.
    pub(super) fn previous(&self, quota: Quota) -> Option<(Quota, QuotaChange)> {
        let &(old, new, how, until) = self.previous.get()?;
        (new == quota && Instant::now() < until).then_some((old, how))
    }
}
