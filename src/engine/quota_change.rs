//! A global rule whose quota changed (ADR 21, 25 and 33): which previous
//! quotas its calls convert from, and for how long. A reload knows the
//! quota it replaces; a gateway started with new rules learns the quotas
//! in play from the fleet's record in Redis. Redis converts each key in
//! the script, and leaves the old states pointing at the new one for
//! gateways still on older rules; local rules convert in `rule`.

use std::time::{Duration, Instant};

use super::global::{Converting, Global};
use crate::backend::redis::{MAX_PREVIOUS, Previous, Record};
use crate::failure::BreakerState;
use crate::policy::QuotaChange;
use crate::quota::Quota;
use crate::rule::Rule;

/// The shortest conversion: a gateway still on the old rules this long
/// after another reloaded follows the keys it moved.
const AT_LEAST: Duration = Duration::from_secs(600);

/// The quotas converted from, most recent first, with until when a state
/// under each may matter.
type From = [Option<(Quota, Instant)>; MAX_PREVIOUS];

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
        let older = was.converting().map(|c| c.from).unwrap_or_default();
        let alive = std::iter::once((old, crate::util::instant::after(now, lasts)))
            .chain(older.into_iter().flatten());
        self.set_converting(Converting {
            from: collect(alive, to, now),
            to,
            how: rule.quota_use.on_quota_change,
            at: crate::util::instant::unix_us().div_euclid(1_000_000),
        });
    }

    /// Enters the rule's quota in the fleet's record and converts from the
    /// quotas in play that were first seen before it: once before the
    /// rule's first Redis decision (so a gateway started with new rules
    /// converts as a reload would; the decisions that arrive meanwhile wait
    /// for that one read), again at each sweep. A read that fails (the
    /// breaker open, Redis past the rule's timeout) is not tried again
    /// before the next sweep: a struggling Redis gets no extra call per
    /// decision.
    pub(super) async fn know_fleet(&self, rule: &Rule) {
        if self.fleet.initialized() {
            return;
        }
        self.fleet.get_or_init(|| self.enter(rule)).await;
    }

    /// One entry in the fleet's record, and what it says; nothing when
    /// Redis cannot be asked (the next sweep asks again).
    pub(super) async fn enter(&self, rule: &Rule) {
        let Some(quota) = rule.static_quota().filter(|q| q.period().is_none()) else {
            return;
        };
        if self.breaker_status().state != BreakerState::Closed {
            return;
        }
        let to = self.counting(rule, quota);
        let read = self
            .redis
            .quotas_in_play(&rule.name, rule.algorithm, &to, lasting(to));
        if let Ok(Ok(record)) = tokio::time::timeout(rule.failure.timeout, read).await {
            self.converting_in_fleet(rule, to, &record);
        }
    }

    /// Adds the quotas of `record` first seen before this gateway's to
    /// what it converts from.
    fn converting_in_fleet(&self, rule: &Rule, to: Quota, record: &Record) {
        let now = Instant::now();
        let mut older: Vec<_> = record
            .others
            .iter()
            .filter(|o| o.first_ms < record.first_ms)
            .collect();
        older.sort_by_key(|o| std::cmp::Reverse(o.first_ms));
        let until = |ms: i64| {
            let left = u64::try_from(ms - record.now_ms).unwrap_or(0);
            crate::util::instant::after(now, Duration::from_millis(left))
        };
        let fleet = older.into_iter().map(|o| (o.quota, until(o.until_ms)));
        let current = self.converting().filter(|c| c.to == to);
        let from = match current {
            Some(c) => collect(c.from.into_iter().flatten().chain(fleet), to, now),
            None => collect(fleet, to, now),
        };
        if from[0].is_none() {
            return;
        }
        let (how, at) = match current {
            Some(c) => (c.how, c.at),
            None => (rule.get_on_quota_change(), record.first_ms.div_euclid(1000)),
        };
        self.set_converting(Converting { from, to, how, at });
    }

    fn converting(&self) -> Option<Converting> {
        *self.previous.read().unwrap_or_else(|e| e.into_inner())
    }

    fn set_converting(&self, c: Converting) {
        *self.previous.write().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// How a decision of `quota` treats usage counted under another.
    pub(super) fn previous(&self, quota: Quota) -> Option<Previous> {
        if !self.fixed {
            return Some(Previous::AS_COUNTED);
        }
        let c = self.converting()?;
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

/// The first [`MAX_PREVIOUS`] of `alive` that may still matter, each once
/// (by the state key it names), `to` left out.
fn collect(alive: impl Iterator<Item = (Quota, Instant)>, to: Quota, now: Instant) -> From {
    let spec = |q: &Quota| (q.limit(), q.window(), q.burst());
    let mut from = [None; MAX_PREVIOUS];
    let mut n = 0;
    for (q, until) in alive.filter(|&(q, until)| spec(&q) != spec(&to) && now < until) {
        if n < MAX_PREVIOUS && !from[..n].iter().flatten().any(|(p, _)| spec(p) == spec(&q)) {
            from[n] = Some((q, until));
            n += 1;
        }
    }
    from
}

/// The longest an old state lives, twice over: a whole bucket refilling,
/// or two windows for the sliding window; ten minutes at least (a lagging
/// gateway follows the moves that long). Saturating: a quota may span years.
fn lasting(q: Quota) -> Duration {
    let refill = q.window().as_secs_f64() * f64::from(q.burst()) / f64::from(q.limit());
    let refill = Duration::try_from_secs_f64(refill).unwrap_or(Duration::MAX);
    refill.max(q.window()).saturating_mul(2).max(AT_LEAST)
}
