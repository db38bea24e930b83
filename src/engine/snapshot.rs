//! A chain's local counters saved for a snapshot, and loaded from one.

use std::time::Duration;

use super::chain::Chain;
use super::rule::share;
use crate::quota::Quota;
use crate::snapshot::{Saved, SavedRule};
use crate::util::instant::unix_us;

impl Chain {
    /// Each local rule with a static quota: its keys' usage, on the wall clock.
    pub(crate) fn export(&self) -> Vec<SavedRule> {
        let now = unix_us();
        self.rules
            .iter()
            .filter_map(|r| {
                let store = r.local_store()?;
                let q = share(&r.rule, r.rule.static_quota()?, r.instances);
                let state = match q.period() {
                    None => {
                        let t = interval_us(q);
                        let keys = store.used().into_iter();
                        Saved::Rolling {
                            limit: q.limit(),
                            window_ns: u64::try_from(q.window().as_nanos()).unwrap_or(u64::MAX),
                            burst: q.burst(),
                            keys: keys
                                .map(|(k, used)| (k, now.saturating_add((used * t) as i64)))
                                .collect(),
                        }
                    }
                    Some(_) => Saved::Calendar {
                        quota: q,
                        keys: store.calendar_counts(),
                    },
                };
                Some(SavedRule {
                    name: r.rule.name.to_string(),
                    state,
                })
            })
            .collect()
    }

    /// Loads `saved` into the rules of the same name, the time since it was
    /// written counted as elapsed; a changed quota converts as the rule's
    /// `QuotaChange` says. How many rules it restored.
    pub(crate) fn import(&self, saved: &[SavedRule]) -> usize {
        let now = unix_us();
        let mut restored = 0;
        for s in saved {
            let found = self.find(&s.name).and_then(|r| {
                let q = share(&r.rule, r.rule.static_quota()?, r.instances);
                Some((r.local_store()?, q, r.rule.quota_use.on_quota_change))
            });
            let Some((store, q, how)) = found else {
                continue;
            };
            match &s.state {
                Saved::Rolling {
                    limit,
                    window_ns,
                    burst,
                    keys,
                } if q.period().is_none() => {
                    let old =
                        Quota::new(*limit, Duration::from_nanos(*window_ns)).with_burst(*burst);
                    let t = interval_us(old);
                    for (key, whole_at) in keys {
                        let used = whole_at.saturating_sub(now) as f64 / t;
                        store.carry_used(key.clone(), used, old, q, how);
                    }
                }
                Saved::Calendar { quota: old, keys } if old.same_windows(&q) => {
                    // Only the window that is still current.
                    let Some((_, end)) = q.window_secs(now.div_euclid(1_000_000)) else {
                        continue;
                    };
                    for (key, count, saved_end) in keys {
                        if *saved_end == end {
                            store.carry_count(key, *count, *old, q, how);
                        }
                    }
                }
                // A rolling quota saved and a calendar one now, or the reverse.
                _ => continue,
            }
            restored += 1;
        }
        restored
    }
}

/// One unit's emission interval in µs, at least 1.
fn interval_us(q: Quota) -> f64 {
    (q.emission_interval().as_nanos() as f64 / 1000.0).max(1e-3)
}
