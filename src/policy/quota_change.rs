//! What a rule's counters become when a reload changes its quota.

/// What a key's usage becomes when a reload
/// ([`RateLimitLayer::reload`](crate::RateLimitLayer::reload), a watched
/// rules file) changes its rule's static quota; set with
/// [`Rule::on_quota_change`](crate::Rule::on_quota_change).
///
/// A key that spent 80 of 100 has, under a new quota of 50:
///
/// | `QuotaChange` | used | left |
/// |---|---|---|
/// | `Proportional` (default) | 40: the fraction used, 80 % | 10 |
/// | `AsIs` | 50: the units used, capped at the new quota | 0 |
/// | `Reset` | 0: a fresh quota | 50 |
///
/// "Used" is what the key has not got back yet: for GCRA and the token
/// bucket, its burst less what it may spend now; for calendar quotas, the
/// window's count. Lowering a limit during an attack therefore keeps the
/// attacker where it was, in proportion, instead of handing it a fresh
/// quota, which is what `Reset` does.
///
/// On a local rule, rolling quotas and calendar quotas of the same period,
/// UTC offset and (for [aligned](crate::Quota::aligned) ones) window
/// convert the usage that exists when the new rules take over: every
/// request the old rules decided counts, however long the reload takes.
/// A key is carried over when the new rules first meet it, or by the
/// reload itself right after the swap, whichever comes first;
/// `reload` returns once every key is. Requests that were already
/// suspended on the old rules at the swap (awaiting Redis for an earlier
/// global rule, or waiting under `OnDeny::Wait`) finish on them, but their
/// local decisions are made in the new store, their cost converted and
/// rounded up.
///
/// On a global rule, nothing scans Redis: each key converts in the script,
/// on Redis time, at its next decision (an exact one, or a lease's grant),
/// from the state it has under the previous quota (a state key names its
/// quota, see `backend::redis`). GCRA, the token bucket and the fixed
/// window convert whatever the windows; the sliding window converts when
/// the window is unchanged (its counts are per aligned window). A gateway
/// that reloads again while converting converts from the older quotas too
/// (up to three). The conversion lasts ten minutes, or twice the longer
/// refill time (window, for the windows) of the two quotas if longer.
///
/// A change is rolling in a fleet: each gateway's watcher fires on its own
/// schedule, or new gateways start with the new rules beside the old ones,
/// which then stop. A gateway started with new rules learns the quotas in
/// play from the fleet's record in Redis (one hash per rule, read at its
/// first decision and at each sweep) and converts from those first seen
/// before its own, exactly as a reloaded gateway does. The gateway that
/// converts a key leaves a tombstone where the
/// old state was, and a gateway still on the old rules follows it: it
/// decides in the moved state, its cost converted proportionally (exactly
/// for GCRA and the token bucket; rounded up to whole units for the
/// windows, so a lagging gateway's requests may cost a fraction of a unit
/// more). The fleet thus counts one state per key, and, whatever the order
/// of the reloads and restarts, **admits no more than the most generous
/// quota in play would alone from the same usage**: with `Proportional`,
/// no more than that quota's unused fraction. This is the invariant the
/// other pages point to. Calendar counts (one per key, whatever
/// the limit) carry the limit they were counted under: a reloaded gateway
/// converts a count of its previous limit by this setting once per window,
/// any other gateway proportionally.
///
/// Bounds: a gateway started with new rules that cannot read the record
/// (Redis failing at its first decision) decides without it until its
/// next sweep reads it, and a key it decides meanwhile starts afresh; a
/// gateway still on the old rules when the
/// conversion has ended counts apart for keys first decided after that;
/// `Reset` on a rolling quota counts afresh in a state of its own, beside
/// the old rules' state. The control handle converts and follows a key
/// as a decision does: an operation on a key this gateway has not decided
/// since its reload converts it first.
///
/// Not converted anywhere: between a rolling and a calendar quota, two
/// calendar periods (aligned windows of two lengths among them), the
/// sliding window across windows, and `quota_fn`
/// rules (each computed quota keeps its own counters): those keys start
/// afresh whatever this says.
///
/// ```
/// use keyed_rate_limit::{KeyExtractor, Quota, Rule, rule::QuotaChange};
/// let r = Rule::new("api", KeyExtractor::header("x-api-key"), Quota::per_minute(100))
///     .on_quota_change(QuotaChange::AsIs);
/// assert_eq!(r.get_on_quota_change(), QuotaChange::AsIs);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum QuotaChange {
    /// Keep the fraction of the quota used.
    #[default]
    Proportional,
    /// Keep the units used, capped at the new quota.
    AsIs,
    /// Start every key afresh.
    Reset,
}

impl QuotaChange {
    /// What `used` of a capacity `from` becomes under a capacity `to`;
    /// `None` for [`Reset`](Self::Reset).
    pub(crate) fn convert(self, used: f64, from: f64, to: f64) -> Option<f64> {
        let used = used.clamp(0.0, from);
        match self {
            Self::Proportional => Some(used / from * to),
            Self::AsIs => Some(used.min(to)),
            Self::Reset => None,
        }
    }

    /// `proportional`, `as_is` or `reset`, as rule files write it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Proportional => "proportional",
            Self::AsIs => "as_is",
            Self::Reset => "reset",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QuotaChange;

    #[test]
    fn eighty_of_a_hundred_under_fifty() {
        let used = |how: QuotaChange| how.convert(80.0, 100.0, 50.0);
        assert_eq!(used(QuotaChange::Proportional), Some(40.0));
        assert_eq!(used(QuotaChange::AsIs), Some(50.0));
        assert_eq!(used(QuotaChange::Reset), None);
        // Raising the quota: the fraction, or the units.
        assert_eq!(
            QuotaChange::Proportional.convert(80.0, 100.0, 200.0),
            Some(160.0)
        );
        assert_eq!(QuotaChange::AsIs.convert(80.0, 100.0, 200.0), Some(80.0));
    }
}
