//! The bandwidth layer's builder, validated when the layer is built.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use super::layer::BandwidthLimitLayer;
use super::shared::{Direction, Shared};
use crate::engine::Meter;
use crate::error::BuildError;
use crate::headers::{Unit, quota_member};
use crate::key::KeyExtractor;
use crate::key::lookup::OnMissingKey;
use crate::quota::Quota;
use crate::rule::{QuotaSource, Rule};
use crate::settings::{self, Settings};

/// Configures a [`BandwidthLimitLayer`]; [`build`](Self::build) checks everything.
///
/// The three builders share their layer-wide settings. Of the headers, a
/// bandwidth layer sends only the draft's `RateLimit-Policy` (with
/// `pu=content-bytes`), under [`HeaderStyle::Draft`](crate::headers::HeaderStyle::Draft)
/// (the default) or `Both`: a paced body is delayed, never refused, so
/// there is no `RateLimit` field and no legacy `X-RateLimit-*` header to
/// send. [`headers`](Self::headers)`(HeaderStyle::Legacy)` therefore sends
/// nothing, as `None` does (and there is no `legacy_reset` to set).
///
/// ```
/// use http::StatusCode;
/// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor, OnMissingKey, bandwidth::Direction};
///
/// let layer = BandwidthLimitLayer::builder("uploads", KeyExtractor::header("x-api-key"), 512 * 1024)
///     .burst(64 * 1024)
///     .direction(Direction::Request)
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
///     .max_keys(10_000)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), keyed_rate_limit::BuildError>(())
/// ```
#[must_use]
#[derive(Debug)]
pub struct BandwidthLimitBuilder {
    /// The budget as a rule: name, key, missing keys, key space, scope.
    pub(super) rule: Rule,
    bytes_per_second: u32,
    burst: Option<u32>,
    direction: Direction,
    settings: Settings,
}

/// The most units the bucket counts a second; see [`BandwidthLimitBuilder::build`].
const UNITS_PER_SECOND: u32 = 1_000_000;

/// How long a leased byte budget lasts by default (global limits).
#[cfg(feature = "redis")]
const LEASE_TTL: Duration = Duration::from_millis(100);

impl BandwidthLimitLayer {
    /// Starts a builder for a limit named `name` (it labels headers and
    /// logs) of `bytes_per_second` body bytes per key found by `key`.
    ///
    /// ```
    /// use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
    /// let err = BandwidthLimitLayer::builder("downloads", KeyExtractor::everyone(), 0).build();
    /// assert!(err.is_err(), "a limit of zero lets nothing through");
    /// ```
    pub fn builder(
        name: impl Into<Arc<str>>,
        key: KeyExtractor,
        bytes_per_second: u32,
    ) -> BandwidthLimitBuilder {
        BandwidthLimitBuilder {
            rule: Rule::new(name, key, Quota::per_second(bytes_per_second)),
            bytes_per_second,
            burst: None,
            direction: Direction::default(),
            settings: Settings::default(),
        }
    }
}

impl BandwidthLimitBuilder {
    settings::settings_setters!(
        "keyed_rate_limit::BandwidthLimitLayer::builder(\"downloads\", KeyExtractor::everyone(), 65_536)"
    );

    /// The most bytes a key may send at once after a quiet spell (default:
    /// one second's worth). Frames are split into pieces of at most half
    /// of it (for a leased global limit, half of what the lease hold-back
    /// leaves of it), so that a piece waits for room, not for a full
    /// bucket; a small burst gives a smooth stream, a large one fewer
    /// wake-ups.
    ///
    /// ```
    /// # use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor};
    /// let l = BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), 65_536).burst(8192).build()?;
    /// assert_eq!(l.burst(), 8192);
    /// # Ok::<(), keyed_rate_limit::BuildError>(())
    /// ```
    pub fn burst(mut self, bytes: u32) -> Self {
        self.burst = Some(bytes);
        self
    }

    /// Which bodies are shaped (default [`Direction::Response`]).
    pub fn direction(mut self, direction: Direction) -> Self {
        self.direction = direction;
        self
    }

    /// What to do when the key extractor finds no key (default: the body
    /// is not shaped, but a key *source* missing from the setup is a 500,
    /// as for rules; see [`OnMissingKey`]).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.rule = self.rule.on_missing_key(policy);
        self
    }

    /// The most keys held in this process (default
    /// [`DEFAULT_MAX_KEYS`](crate::rule::DEFAULT_MAX_KEYS)), as for
    /// [`Rule::max_keys`].
    pub fn max_keys(mut self, n: usize) -> Self {
        self.rule = self.rule.max_keys(n);
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// An invalid name, a zero rate or burst, `max_keys` of zero, a
    /// `max_key_len` below 64; for a global limit also what
    /// [`Rule::global`](crate::Rule) and leases check (a burst no larger
    /// than the bytes one lease `ttl` brings); see [`BuildError`].
    pub fn build(self) -> Result<BandwidthLimitLayer, BuildError> {
        let Self {
            mut rule,
            bytes_per_second,
            burst,
            direction,
            settings,
        } = self;
        settings.validate()?;
        let burst = burst.unwrap_or(bytes_per_second);
        // The bucket counts units of `unit` bytes, at most 10⁶ a second: an
        // emission interval of a microsecond or more, whose truncation to
        // whole nanoseconds costs at most 0.1 % of the rate.
        let unit = bytes_per_second.div_ceil(UNITS_PER_SECOND).max(1);
        let burst_units = burst.div_ceil(unit);
        let quota = Quota::per_second(bytes_per_second / unit).with_burst(burst_units);
        rule.quota = QuotaSource::Static(quota);
        // Half the burst: a piece waits for room, not for a full bucket, so
        // a timer that fires late loses no bytes (they wait in the bucket).
        let piece = burst_units.saturating_sub(leased_holdback(&mut rule, quota)) / 2;
        let name = rule.name.clone();
        let key_name: Arc<str> = rule.key.name().into();
        let global = rule.scope.is_global();
        let meter = Meter::new(rule, settings.instances, settings.max_key_len)?;
        let policy = settings.headers.draft().then(|| {
            let mut item = String::new();
            quota_member(
                &mut item,
                &name,
                bytes_per_second,
                Duration::from_secs(1),
                Unit::ContentBytes,
            );
            HeaderValue::try_from(item).ok()
        });
        Ok(BandwidthLimitLayer {
            shared: Arc::new(Shared {
                name,
                key_name,
                meter,
                bytes_per_second,
                burst,
                unit,
                piece: NonZeroU32::new(piece.max(1).saturating_mul(unit))
                    .unwrap_or(NonZeroU32::MIN),
                direction,
                max_key_len: settings.max_key_len,
                quota_member: policy.flatten(),
                deny: settings.refusals,
                global,
            }),
        })
    }
}

/// The units a leased budget holds back from the burst (those one lease
/// `ttl` brings): Redis refuses a piece above the rest. A global limit
/// leases by default.
#[cfg(feature = "redis")]
fn leased_holdback(rule: &mut Rule, quota: Quota) -> u32 {
    if !matches!(rule.scope, crate::rule::Scope::Global(_)) {
        return 0;
    }
    let lease = *rule
        .global
        .lease
        .get_or_insert(crate::rule::LeasePolicy::new(LEASE_TTL));
    u32::try_from(lease.held_back(&quota)).unwrap_or(u32::MAX)
}

#[cfg(not(feature = "redis"))]
fn leased_holdback(_: &mut Rule, _: Quota) -> u32 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate the bucket enforces, in bytes a second: governor's
    /// emission interval is whole nanoseconds.
    fn enforced(bytes_per_second: u32) -> f64 {
        let l = BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), bytes_per_second)
            .build()
            .unwrap();
        let q = l.shared.meter.as_rule().static_quota().unwrap();
        let t = q.emission_interval().as_nanos() as f64;
        f64::from(l.shared.unit) * 1e9 / t
    }

    #[test]
    fn every_rate_is_enforced_within_a_thousandth() {
        for rate in [
            1,
            1000,
            262_144,
            999_999,
            1_000_001,
            30_000_000,
            123_456_789,
            999_999_937,
            u32::MAX,
        ] {
            let off = (enforced(rate) - f64::from(rate)) / f64::from(rate);
            assert!(
                off.abs() < 1e-3,
                "{rate} B/s is enforced as {}",
                enforced(rate)
            );
        }
    }
}
