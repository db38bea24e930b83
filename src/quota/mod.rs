//! Quotas: how many units a key may spend per window, and how many at once.
//!
//! A [`Quota`] is a limit per window with a burst (which defaults to the
//! limit). Two kinds exist:
//!
//! - **Rolling** ([`Quota::new`], [`per_second`](Quota::per_second),
//!   [`per_minute`](Quota::per_minute), [`per_hour`](Quota::per_hour)):
//!   units come back through the window, one every `window / limit` under
//!   GCRA; [`with_burst`](Quota::with_burst) bounds how many go at once.
//! - **Calendar** ([`per_calendar_day`](Quota::per_calendar_day),
//!   [`per_calendar_month`](Quota::per_calendar_month),
//!   [`aligned`](Quota::aligned), and [`Period`] for the rest): the
//!   count starts again at each boundary (midnight UTC, or
//!   [`with_utc_offset`](Quota::with_utc_offset), the first of each
//!   month with month lengths and leap years right, or each whole
//!   multiple of an aligned window since the epoch, as
//!   envoyproxy/ratelimit counts), as API plans are sold. A key may spend
//!   the whole limit just before a boundary and again just after.
//!
//! "Per day" is said one way for each: a rolling day is
//! `Quota::new(limit, Duration::from_secs(86_400))`, `"1000/day"` in a
//! rules file; a calendar day is [`Quota::per_calendar_day`],
//! `"1000/calendar_day"` in a rules file.
//!
//! Nothing is checked at construction: the layer's `build` checks every
//! static quota ([`QuotaError`] inside its `BuildError`), and a quota
//! computed per request that admits nothing answers 429 without
//! `Retry-After`.
//!
//! ```
//! use std::time::Duration;
//! use keyed_rate_limit::Quota;
//!
//! let steady = Quota::per_minute(100).with_burst(10);
//! assert_eq!((steady.limit(), steady.burst()), (100, 10));
//! assert_eq!(Quota::new(5, Duration::from_secs(1)), Quota::per_second(5));
//! ```

use std::fmt;
use std::time::{Duration, SystemTime};

mod calendar;

pub use calendar::Period;

/// A rate: `limit` units per `window`, with up to `burst` units spent at once.
///
/// The burst defaults to the limit, which is what most people mean by
/// "100 per minute". A smaller burst smooths traffic; a larger one lets a
/// quiet client catch up. Values are checked when the layer is built (see
/// [`Quota::validate`]), never at request time.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::Quota;
///
/// let q = Quota::per_minute(100).with_burst(20);
/// assert_eq!(q.limit(), 100);
/// assert_eq!(q.window(), Duration::from_secs(60));
/// assert_eq!(q.burst(), 20);
/// assert!(q.validate().is_ok());
/// assert!(Quota::per_second(0).validate().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u32,
    window: Duration,
    burst: Option<u32>,
    /// Set for calendar quotas: windows start at calendar boundaries.
    period: Option<Period>,
    /// Seconds east of UTC where the calendar's days start.
    utc_offset: i32,
}

impl Quota {
    /// `limit` units per `window`.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::Quota;
    /// let q = Quota::new(5, Duration::from_secs(10));
    /// assert_eq!(q.burst(), 5);
    /// ```
    pub const fn new(limit: u32, window: Duration) -> Self {
        Self {
            limit,
            window,
            burst: None,
            period: None,
            utc_offset: 0,
        }
    }

    /// `limit` units per second.
    ///
    /// ```
    /// # use keyed_rate_limit::Quota;
    /// assert_eq!(Quota::per_second(10).window().as_secs(), 1);
    /// ```
    pub const fn per_second(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    ///
    /// ```
    /// # use keyed_rate_limit::Quota;
    /// assert_eq!(Quota::per_minute(10).window().as_secs(), 60);
    /// ```
    pub const fn per_minute(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    ///
    /// ```
    /// # use keyed_rate_limit::Quota;
    /// assert_eq!(Quota::per_hour(10).window().as_secs(), 3600);
    /// ```
    pub const fn per_hour(limit: u32) -> Self {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// `limit` units per calendar day, from midnight UTC to midnight UTC
    /// (see [`with_utc_offset`](Self::with_utc_offset) for another zone):
    /// `"<limit>/calendar_day"` in a rules file. A rolling day, whose units
    /// come back through the day, is `Quota::new(limit,
    /// Duration::from_secs(86_400))`, `"<limit>/day"` in a rules file.
    ///
    /// A calendar quota is counted as a fixed window whose edges are
    /// calendar boundaries, whatever the rule's [`Algorithm`](crate::Algorithm):
    /// a key may spend all `limit` units at 23:59 and `limit` more at 00:00,
    /// as API plans sold per day mean. It has no burst. Decisions carry the
    /// window's own length (the `w` of the `RateLimit` headers) and the time
    /// to its end (`t` and `Retry-After`). Local rules read the system clock
    /// as UTC; global rules read Redis `TIME`.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime, UNIX_EPOCH};
    /// use keyed_rate_limit::Quota;
    ///
    /// let q = Quota::per_calendar_day(1000);
    /// let noon = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 12 * 3600);
    /// let (start, end) = q.calendar_window(noon).unwrap();
    /// assert_eq!(end.duration_since(start).unwrap(), Duration::from_secs(86_400));
    /// assert_eq!(noon.duration_since(start).unwrap(), Duration::from_secs(12 * 3600));
    /// ```
    pub const fn per_calendar_day(limit: u32) -> Self {
        Self::calendar(limit, Period::Day, 1)
    }

    /// `limit` units per calendar month, from midnight UTC on the first to
    /// midnight UTC on the first of the next month. Months have their own
    /// lengths (28 to 31 days, leap years included); [`window`](Self::window)
    /// is the longest, 31 days, and each decision carries its month's.
    /// `"<limit>/calendar_month"` in a rules file. Otherwise as
    /// [`per_calendar_day`](Self::per_calendar_day).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use keyed_rate_limit::Quota;
    ///
    /// // 2024-02-29T12:00:00Z: February 2024 has 29 days.
    /// let leap_day = UNIX_EPOCH + Duration::from_secs(1_709_208_000);
    /// let (start, end) = Quota::per_calendar_month(10_000).calendar_window(leap_day).unwrap();
    /// assert_eq!(end.duration_since(start).unwrap(), Duration::from_secs(29 * 86_400));
    /// ```
    pub const fn per_calendar_month(limit: u32) -> Self {
        Self::calendar(limit, Period::Month, 31)
    }

    /// `limit` units per `window`, counted in fixed windows aligned on the
    /// clock, as envoyproxy/ratelimit counts: the window holding `now`
    /// (seconds since 1970-01-01T00:00:00Z) is `[now - now % len, now -
    /// now % len + len)` for a window of `len` seconds, and every unit comes
    /// back at its end, in `len - now % len` seconds.
    /// [`with_utc_offset`](Self::with_utc_offset) moves the edges as it moves
    /// a calendar day's. `"<limit>/aligned_<window>"` in a rules file
    /// (`"50/aligned_min"`, `"1000/aligned_15min"`).
    ///
    /// It is a calendar quota of period [`Period::Aligned`], counted as
    /// [`per_calendar_day`](Self::per_calendar_day) is, whatever the rule's
    /// [`Algorithm`](crate::Algorithm): no burst, the window's length as
    /// `w` and the time to its end as `t` and `Retry-After`, on the system
    /// clock (UTC) for local rules and Redis `TIME` for global ones. Every
    /// gateway, and envoyproxy/ratelimit itself, sees the same windows:
    /// their resets agree to the second. Its units are windows of 1, 60,
    /// 3,600, 86,400 and 604,800 seconds, a "month" of 30 days and a "year"
    /// of 365: not [calendar months](Self::per_calendar_month).
    ///
    /// Prefer [`Quota::new`] (GCRA) unless you need those edges: a fixed
    /// window lets a key spend `limit` just before an edge and `limit` again
    /// just after (twice the rate for a moment), and refuses it for the
    /// rest of the window once spent, while GCRA spaces units evenly and
    /// gives them back one at a time. [`validate`](Self::validate) refuses
    /// a window that is zero, not a whole number of seconds, or longer than
    /// 100 years of 365 days.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use keyed_rate_limit::{Quota, quota::Period};
    ///
    /// let q = Quota::aligned(50, Duration::from_secs(60));
    /// assert_eq!(q.period(), Some(Period::Aligned));
    /// // 12:34:56 UTC: the minute from 12:34:00, whole again in 4 seconds.
    /// let now = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400 + 12 * 3600 + 34 * 60 + 56);
    /// let (start, end) = q.calendar_window(now).unwrap();
    /// assert_eq!(now.duration_since(start).unwrap(), Duration::from_secs(56));
    /// assert_eq!(end.duration_since(now).unwrap(), Duration::from_secs(4));
    /// assert!(Quota::aligned(50, Duration::from_millis(1500)).validate().is_err());
    /// ```
    pub const fn aligned(limit: u32, window: Duration) -> Self {
        Self {
            period: Some(Period::Aligned),
            ..Self::new(limit, window)
        }
    }

    /// A day's or a month's quota; `window` is the longest, in days.
    const fn calendar(limit: u32, period: Period, days: u64) -> Self {
        Self {
            period: Some(period),
            ..Self::new(limit, Duration::from_secs(days * calendar::DAY_SECS as u64))
        }
    }

    /// Moves a calendar quota's boundaries to a fixed offset from UTC, in
    /// seconds east (`19_800` for India's +05:30, `-18_000` for UTC-05:00).
    /// Offsets are fixed: a zone with daylight saving time needs a quota per
    /// season. [`validate`](Self::validate) refuses an offset of a day or
    /// more, or one on a quota that is not a calendar quota.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use keyed_rate_limit::Quota;
    ///
    /// let ist = Quota::per_calendar_day(100).with_utc_offset(5 * 3600 + 1800);
    /// // Midnight UTC is 05:30 in India: the day began 5.5 hours before.
    /// let t = UNIX_EPOCH + Duration::from_secs(20_000 * 86_400);
    /// let (start, _) = ist.calendar_window(t).unwrap();
    /// assert_eq!(t.duration_since(start).unwrap(), Duration::from_secs(19_800));
    /// assert!(Quota::per_minute(1).with_utc_offset(3600).validate().is_err());
    /// ```
    pub const fn with_utc_offset(mut self, seconds: i32) -> Self {
        self.utc_offset = seconds;
        self
    }

    /// The calendar period of a calendar quota.
    pub const fn period(&self) -> Option<Period> {
        self.period
    }

    /// The calendar's offset from UTC, in seconds east.
    pub const fn utc_offset(&self) -> i32 {
        self.utc_offset
    }

    /// The calendar window holding `at`, as its start and end; `None` for
    /// a quota that is not a calendar quota, or an aligned one whose window
    /// [`validate`](Self::validate) refuses. Instants before 1970 count as
    /// 1970-01-01T00:00:00Z.
    pub fn calendar_window(&self, at: SystemTime) -> Option<(SystemTime, SystemTime)> {
        // Instants before 1970 count as its first second.
        let secs = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2));
        let (start, end) = self.window_secs(secs)?;
        let at_secs =
            |s: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(s).unwrap_or(0));
        Some((at_secs(start), at_secs(end)))
    }

    /// The calendar window holding `now` (seconds since the epoch), in
    /// seconds since the epoch.
    pub(crate) fn window_secs(&self, now: i64) -> Option<(i64, i64)> {
        let len = match self.period? {
            Period::Aligned => self.aligned_secs()?,
            _ => 0,
        };
        Some(calendar::window(self.period?, self.utc_offset, now, len))
    }

    /// An aligned window's length in seconds: whole, from one second to
    /// the longest the scripts count exactly.
    const fn aligned_secs(&self) -> Option<i64> {
        let secs = self.window.as_secs();
        if self.window.subsec_nanos() == 0 && secs >= 1 && secs <= calendar::MAX_ALIGNED_SECS {
            Some(secs as i64)
        } else {
            None
        }
    }

    /// Whether both are calendar quotas counted in the same windows: of one
    /// period, UTC offset and (for aligned ones) length, whatever the limits.
    pub(crate) fn same_windows(&self, other: &Self) -> bool {
        self.period.is_some()
            && (self.period, self.utc_offset, self.window)
                == (other.period, other.utc_offset, other.window)
    }

    /// Sets the burst: the most units a key may spend at once.
    ///
    /// ```
    /// # use keyed_rate_limit::Quota;
    /// assert_eq!(Quota::per_minute(60).with_burst(1).burst(), 1);
    /// ```
    pub const fn with_burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Units per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window the limit is counted over.
    pub const fn window(&self) -> Duration {
        self.window
    }

    /// The most units that can be spent at once (defaults to the limit).
    pub const fn burst(&self) -> u32 {
        match self.burst {
            Some(b) => b,
            None => self.limit,
        }
    }

    /// The time it takes to earn back one unit: `window / limit`.
    ///
    /// Returns [`Duration::ZERO`] for an invalid quota with a zero limit.
    #[doc(hidden)]
    pub fn emission_interval(&self) -> Duration {
        if self.limit == 0 {
            return Duration::ZERO;
        }
        self.window / self.limit
    }

    /// Checks that the quota can ever admit anything.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::Quota;
    /// assert!(Quota::per_second(0).validate().is_err());
    /// assert!(Quota::per_second(1).with_burst(0).validate().is_err());
    /// assert!(Quota::new(1, Duration::ZERO).validate().is_err());
    /// assert!(Quota::aligned(1, Duration::from_millis(500)).validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), QuotaError> {
        if self.limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if self.window.is_zero() {
            return Err(QuotaError::ZeroWindow);
        }
        if self.burst() == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if self.emission_interval().is_zero() {
            return Err(QuotaError::TooFine);
        }
        match self.period {
            None if self.utc_offset != 0 => Err(QuotaError::OffsetWithoutCalendar),
            Some(Period::Aligned) if self.window.subsec_nanos() != 0 => {
                Err(QuotaError::AlignedNotWholeSeconds)
            }
            Some(Period::Aligned) if self.aligned_secs().is_none() => {
                Err(QuotaError::AlignedTooLong)
            }
            Some(_) if i64::from(self.utc_offset).abs() >= calendar::DAY_SECS => {
                Err(QuotaError::OffsetOutOfRange)
            }
            Some(_) if self.burst() != self.limit => Err(QuotaError::BurstOnCalendar),
            _ => Ok(()),
        }
    }

    /// The share of this quota one of `instances` gateways may admit on its
    /// own; limit and burst are divided and rounded up, so no share is zero.
    pub(crate) fn divided_by(self, instances: u32) -> Self {
        let n = instances.max(1);
        let burst = self.burst().div_ceil(n);
        Self {
            limit: self.limit.div_ceil(n),
            // A calendar quota has no burst of its own.
            burst: self.burst.map(|_| burst),
            ..self
        }
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Renders as `100/60s burst 20`, `1000/calendar day UTC+05:30`, or
/// `50/aligned 60s`.
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = self.period {
            match p {
                Period::Aligned => write!(f, "{}/aligned {:?}", self.limit, self.window)?,
                _ => write!(f, "{}/calendar {}", self.limit, p.as_str())?,
            }
            if self.utc_offset != 0 {
                write!(f, " UTC{}", Offset(self.utc_offset))?;
            }
            return Ok(());
        }
        write!(f, "{}/{:?}", self.limit, self.window)?;
        if self.burst() != self.limit {
            write!(f, " burst {}", self.burst())?;
        }
        Ok(())
    }
}

/// An offset from UTC as `+05:30` or `-08:00` (seconds, if any, dropped).
pub(crate) struct Offset(pub(crate) i32);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { '-' } else { '+' };
        let m = self.0.unsigned_abs() / 60;
        write!(f, "{sign}{:02}:{:02}", m / 60, m % 60)
    }
}

/// Why a [`Quota`] can never admit a request.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit is zero.
    ZeroLimit,
    /// The window is zero.
    ZeroWindow,
    /// The burst is zero.
    ZeroBurst,
    /// `window / limit` is below one nanosecond.
    TooFine,
    /// A UTC offset on a quota that is not a calendar quota.
    OffsetWithoutCalendar,
    /// A calendar quota's UTC offset is a day or more.
    OffsetOutOfRange,
    /// A calendar quota with a burst: calendar windows have none.
    BurstOnCalendar,
    /// An [aligned](Quota::aligned) window that is not a whole number of
    /// seconds.
    AlignedNotWholeSeconds,
    /// An [aligned](Quota::aligned) window longer than 100 years of 365
    /// days.
    AlignedTooLong,
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ZeroLimit => "the limit is zero",
            Self::ZeroWindow => "the window is zero",
            Self::ZeroBurst => "the burst is zero",
            Self::TooFine => "window / limit is below one nanosecond",
            Self::OffsetWithoutCalendar => {
                "a UTC offset needs a calendar quota (per_calendar_day, per_calendar_month, aligned)"
            }
            Self::OffsetOutOfRange => "the UTC offset is a day or more",
            Self::BurstOnCalendar => "a calendar quota has no burst",
            Self::AlignedNotWholeSeconds => "an aligned window is not a whole number of seconds",
            Self::AlignedTooLong => "an aligned window is longer than 100 years",
        })
    }
}

impl std::error::Error for QuotaError {}
crate::util::report::debug_as_display!(QuotaError);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_window_is_whole_seconds_up_to_a_century() {
        let aligned = |d| Quota::aligned(10, d);
        let max = Duration::from_secs(calendar::MAX_ALIGNED_SECS);
        assert_eq!(
            aligned(Duration::ZERO).validate(),
            Err(QuotaError::ZeroWindow)
        );
        assert_eq!(
            aligned(Duration::from_millis(1500)).validate(),
            Err(QuotaError::AlignedNotWholeSeconds)
        );
        assert_eq!(
            aligned(max + Duration::from_secs(1)).validate(),
            Err(QuotaError::AlignedTooLong)
        );
        assert_eq!(
            aligned(Duration::from_secs(60)).with_burst(5).validate(),
            Err(QuotaError::BurstOnCalendar)
        );
        assert_eq!(aligned(max).validate(), Ok(()));
        // A window validate refuses has none, rather than a panic.
        assert_eq!(
            aligned(Duration::ZERO).calendar_window(SystemTime::now()),
            None
        );
        assert_eq!(aligned(Duration::from_millis(1500)).window_secs(0), None);
        assert_eq!(aligned(max).window_secs(0), Some((0, max.as_secs() as i64)));
        assert_eq!(
            aligned(Duration::from_secs(60))
                .with_utc_offset(-3600)
                .to_string(),
            "10/aligned 60s UTC-01:00"
        );
    }
}
