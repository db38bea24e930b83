//! A global rule after a reload changed its quota (ADR 21 and 25): which
//! previous quotas its calls convert from, and for how long. Redis converts
//! each key in the script, and leaves the old states pointing at the new
//! one for gateways still on older rules; local rules convert in `rule`.

use std::time::{Duration, Instant};

use super::global::{Converting, Global};
use crate::backend::redis::{MAX_PREVIOUS, Previous};
use crate::policy::QuotaChange;
use crate::quota::Quota;
use crate::rule::Rule;

/// The shortest conversion: a gateway still on the old rules this long
/// after another reloaded follows the keys it moved.
const AT_LEAST: Duration = Duration::from_secs(600);

impl Global {
    /// After a reload that changed `rule`'s static quota from `old` (and
    /// `was`, the rule it replaces, may have been converting from older
    /// ones): keys convert their old state at their next decision, while it
    /// may exist.
    pub(super) fn converting_from(&self, rule: &Rule, old: Quota, was: &Global) {
        let Some(new) = rule.static_quota() else {
            return;
        };
        let (old, to) = (self.counting(rule, old), self.counting(rule, new));
        let now = Instant::now();
        let lasts = lasting(old).max(lasting(to));
        let mut from = [None; MAX_PREVIOUS];
        let older = was
            .previous
            .get()
            .into_iter()
            .flat_map(|c| c.from.iter().flatten());
        let alive = std::iter::once((old, crate::util::instant::after(now, lasts)))
            .chain(older.copied())
            .filter(|&(q, until)| q != to && now < until);
        let mut n = 0;
        for (q, until) in alive {
            if n < MAX_PREVIOUS && !from[..n].iter().flatten().any(|(p, _)| *p == q) {
                from[n] = Some((q, until));
                n += 1;
            }
        }
        let at = crate::util::instant::unix_us().div_euclid(1_000_000);
        let how = rule.on_quota_change;
        let _ = self.previous.set(Converting { from, to, how, at });
    }

    /// How a decision of `quota` treats usage counted under another.
    pub(super) fn previous(&self, quota: Quota) -> Option<Previous> {
        if !self.fixed {
            return Some(Previous::AS_COUNTED);
        }
        let c = self.previous.get()?;
        if c.to != quota {
            return None;
        }
        let now = Instant::now();
        let mut quotas = [None; MAX_PREVIOUS];
        let alive = c.from.iter().flatten().filter(|(_, until)| now < *until);
        for (slot, (q, _)) in quotas.iter_mut().zip(alive) {
            *slot = Some(*q);
        }
        // A rolling quota reset counts afresh in a key of its own; a
        // calendar count, one per key, is set to zero once by the script.
        let reset = c.how == QuotaChange::Reset && quota.period().is_none();
        (quotas[0].is_some() && !reset).then_some(Previous {
            quotas,
            how: Some(c.how),
            at: c.at,
        })
    }
}

/// The longest an old state lives, twice over: a whole bucket refilling,
/// or two windows for the sliding window; ten minutes at least (a lagging
/// gateway follows the moves that long). Saturating: a quota may span years.
fn lasting(q: Quota) -> Duration {
    let refill = q.window().as_secs_f64() * f64::from(q.burst()) / f64::from(q.limit());
    let refill = Duration::try_from_secs_f64(refill).unwrap_or(Duration::MAX);
    refill.max(q.window()).saturating_mul(2).max(AT_LEAST)
}
