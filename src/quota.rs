//! Quotas: how many units a key may spend per window, and how many at once.

use std::fmt;
use std::time::Duration;

use crate::error::QuotaError;

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
/// assert_eq!(q.emission_interval(), Duration::from_millis(600));
/// assert!(q.validate().is_ok());
/// assert!(Quota::per_second(0).validate().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u32,
    window: Duration,
    burst: Option<u32>,
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
        Ok(())
    }

    /// The share of this quota one of `instances` gateways may admit on its
    /// own; limit and burst are divided and rounded up, so no share is zero.
    ///
    /// ```
    /// # use keyed_rate_limit::Quota;
    /// let q = Quota::per_minute(100).with_burst(10).divided_by(3);
    /// assert_eq!((q.limit(), q.burst()), (34, 4));
    /// ```
    pub fn divided_by(self, instances: u32) -> Self {
        let n = instances.max(1);
        Self {
            limit: self.limit.div_ceil(n),
            window: self.window,
            burst: Some(self.burst().div_ceil(n)),
        }
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Renders as `100/60s burst 20`.
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:?}", self.limit, self.window)?;
        if self.burst() != self.limit {
            write!(f, " burst {}", self.burst())?;
        }
        Ok(())
    }
}
