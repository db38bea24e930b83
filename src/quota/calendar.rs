//! Calendar arithmetic for quotas that reset at midnight, on the first of
//! the month, or at each whole multiple of a window since the epoch:
//! proleptic Gregorian, on days since the Unix epoch (Howard Hinnant's
//! `days_from_civil`). `lua/calendar.lua` does the same sums on Redis
//! `TIME`; a test runs both over the same instants.

/// The calendar period a quota resets on.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{Quota, quota::Period};
/// assert_eq!(Quota::per_calendar_month(10_000).period(), Some(Period::Month));
/// assert_eq!(Period::Day.as_str(), "day");
/// assert_eq!(Quota::aligned(50, Duration::from_secs(60)).period(), Some(Period::Aligned));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Period {
    /// From midnight to midnight.
    Day,
    /// From midnight on the first of a month to the first of the next.
    Month,
    /// From one whole multiple of the quota's [`window`](crate::Quota::window)
    /// since 1970-01-01T00:00:00Z to the next ([`Quota::aligned`](crate::Quota::aligned)).
    Aligned,
}

impl Period {
    /// `day`, `month` or `aligned`, as snapshots and rules files
    /// (`"1000/calendar_day"`, `"50/aligned_min"`) name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Day => "day",
            Self::Month => "month",
            Self::Aligned => "aligned",
        }
    }
}

pub(super) const DAY_SECS: i64 = 86_400;

/// The longest aligned window: 100 years of 365 days. The scripts count in
/// doubles, exact to 2^53; the µs to a window's end stay below it.
pub(super) const MAX_ALIGNED_SECS: u64 = 100 * 365 * DAY_SECS as u64;

/// The window of `period`, at a UTC offset of `offset` seconds, that holds
/// `now` (seconds since the epoch): its start and end, in seconds since the
/// epoch. `len` is an aligned window's length in seconds (at least 1); the
/// calendar's periods have their own.
pub(super) fn window(period: Period, offset: i32, now: i64, len: i64) -> (i64, i64) {
    let offset = i64::from(offset);
    let day = (now + offset).div_euclid(DAY_SECS);
    let (start, end) = match period {
        Period::Aligned => {
            let start = (now + offset).div_euclid(len) * len;
            return (start - offset, start + len - offset);
        }
        Period::Day => (day, day + 1),
        Period::Month => {
            let (y, m) = year_month(day);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (first_of_month(y, m), first_of_month(ny, nm))
        }
    };
    (start * DAY_SECS - offset, end * DAY_SECS - offset)
}

/// Days since 1970-01-01 of the first of month `m` (1-12) of year `y`.
fn first_of_month(y: i64, m: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12; // March is 0: the leap day ends the year.
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The year and month (1-12) of a day since 1970-01-01.
fn year_month(days: i64) -> (i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A day's or a month's window: they take no length.
    fn window(period: Period, offset: i32, now: i64) -> (i64, i64) {
        super::window(period, offset, now, 0)
    }

    /// Seconds since the epoch of `y-m-d 00:00:00` UTC, by counting days.
    fn midnight(y: i64, m: i64, d: i64) -> i64 {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let month_len = |y: i64, m: i64| match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let mut days = 0;
        for year in 1970..y {
            days += if leap(year) { 366 } else { 365 };
        }
        for month in 1..m {
            days += month_len(y, month);
        }
        (days + d - 1) * DAY_SECS
    }

    #[test]
    fn month_ends_and_leap_days() {
        let month = |t| window(Period::Month, 0, t);
        // 29 February 2024: February has 29 days.
        let leap_day = midnight(2024, 2, 29) + 12 * 3600;
        assert_eq!(
            month(leap_day),
            (midnight(2024, 2, 1), midnight(2024, 3, 1))
        );
        assert_eq!(midnight(2024, 3, 1) - midnight(2024, 2, 1), 29 * DAY_SECS);
        // 2100 is not a leap year, 2000 is.
        assert_eq!(
            month(midnight(2100, 2, 28)).1 - month(midnight(2100, 2, 28)).0,
            28 * DAY_SECS
        );
        assert_eq!(
            month(midnight(2000, 2, 10)).1 - month(midnight(2000, 2, 10)).0,
            29 * DAY_SECS
        );
        // The last second of a month, and the first of the next.
        let new_year = midnight(2027, 1, 1);
        assert_eq!(month(new_year - 1), (midnight(2026, 12, 1), new_year));
        assert_eq!(month(new_year), (new_year, midnight(2027, 2, 1)));
        assert_eq!(
            window(Period::Day, 0, leap_day),
            (midnight(2024, 2, 29), midnight(2024, 3, 1))
        );
    }

    #[test]
    fn offsets_move_the_boundaries() {
        let ist = 5 * 3600 + 1800; // UTC+05:30
        let t = midnight(2026, 3, 31) + 20 * 3600; // 01:30 on 1 April in India
        assert_eq!(
            window(Period::Month, ist, t),
            (
                midnight(2026, 4, 1) - i64::from(ist),
                midnight(2026, 5, 1) - i64::from(ist)
            )
        );
        assert_eq!(
            window(Period::Day, -8 * 3600, midnight(2026, 6, 1) + 3600),
            (
                midnight(2026, 5, 31) + 8 * 3600,
                midnight(2026, 6, 1) + 8 * 3600
            )
        );
    }

    #[test]
    fn every_day_of_four_centuries_lies_in_its_month() {
        let (mut t, end) = (midnight(1970, 1, 1), midnight(2400, 1, 1));
        let mut months = 0;
        while t < end {
            let (start, next) = window(Period::Month, 0, t);
            assert!(start <= t && t < next);
            assert!((28..=31).contains(&((next - start) / DAY_SECS)));
            assert_eq!(window(Period::Month, 0, next - 1), (start, next));
            t = next;
            months += 1;
        }
        assert_eq!(months, 430 * 12);
    }

    /// envoyproxy/ratelimit's units, its window `[now - now % len, … + len)`
    /// and its reset `len - now % len`, on edges and between them.
    #[test]
    fn aligned_windows_are_envoys() {
        const UNITS: [i64; 7] = [
            1,
            60,
            3600,
            DAY_SECS,
            7 * DAY_SECS,
            30 * DAY_SECS,
            365 * DAY_SECS,
        ];
        for len in UNITS {
            for now in [
                0,
                1,
                len - 1,
                len,
                1_767_225_599,
                1_767_225_600,
                4_102_444_799,
            ] {
                let (start, end) = super::window(Period::Aligned, 0, now, len);
                assert_eq!(
                    (start, end),
                    (now - now % len, now - now % len + len),
                    "{len} at {now}"
                );
                assert_eq!(end - now, len - now % len, "the reset, {len} at {now}");
            }
        }
        // A week's windows end on Thursdays, as 1970-01-01 was one.
        assert_eq!(
            super::window(Period::Aligned, 0, 1, 7 * DAY_SECS).1,
            7 * DAY_SECS
        );
    }

    #[test]
    fn an_offset_moves_aligned_windows_as_it_moves_days() {
        let ist = 5 * 3600 + 1800;
        let t = midnight(2026, 3, 31) + 20 * 3600;
        // An aligned day is a calendar day, at any offset.
        for offset in [0, ist, -8 * 3600] {
            assert_eq!(
                super::window(Period::Aligned, offset, t, DAY_SECS),
                window(Period::Day, offset, t)
            );
        }
        // Hours at +05:30 end at half past each UTC hour.
        let (start, end) = super::window(Period::Aligned, ist, t, 3600);
        assert_eq!((start % 3600, end - start), (1800, 3600));
        assert!(start <= t && t < end);
    }
}
