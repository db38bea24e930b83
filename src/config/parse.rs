//! Values that are strings in the file but checked while deserializing, so a
//! bad one is reported with the line and column it came from.

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use http::StatusCode;
use http::header::HeaderName;
use serde::de::{self, Deserialize, Deserializer, Visitor};

use crate::quota::Quota;

/// Deserializes any `FromStr` type whose error is a message, from a string.
pub(crate) fn from_str<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr<Err = String>,
{
    struct V<T>(PhantomData<T>);
    impl<T: FromStr<Err = String>> Visitor<'_> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
            s.parse().map_err(E::custom)
        }
    }
    d.deserialize_str(V(PhantomData))
}

macro_rules! string_de {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                from_str(d)
            }
        }
    )*};
}
string_de!(QuotaSpec, DurationSpec, KeySpec, MissingSpec, OffsetSpec);

/// `"100/min"`, `"10/5s"`, `"1/day"`: a limit per window; `"1000/calendar_day"`
/// and `"10000/calendar_month"`: a limit per calendar period; `"50/aligned_min"`,
/// `"10/aligned_5s"`: a limit per window aligned on the clock (`Quota::aligned`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuotaSpec(pub(crate) Quota);

/// `near_limit_ratio = 0.1`, or `false` for none; checked to be in (0, 1].
#[derive(Debug, Clone, Copy)]
pub(crate) struct NearLimitSpec(pub(crate) Option<f64>);

impl<'de> Deserialize<'de> for NearLimitSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NearLimitSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a ratio in (0, 1], or false")
            }
            fn visit_f64<E: de::Error>(self, r: f64) -> Result<NearLimitSpec, E> {
                if r > 0.0 && r <= 1.0 {
                    Ok(NearLimitSpec(Some(r)))
                } else {
                    Err(E::custom(format!(
                        "invalid near_limit_ratio {r}: expected a ratio in (0, 1], or false"
                    )))
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<NearLimitSpec, E> {
                self.visit_f64(n as f64)
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<NearLimitSpec, E> {
                self.visit_f64(n as f64)
            }
            fn visit_bool<E: de::Error>(self, on: bool) -> Result<NearLimitSpec, E> {
                if on {
                    Err(E::custom(
                        "near_limit_ratio takes a ratio in (0, 1], or false",
                    ))
                } else {
                    Ok(NearLimitSpec(None))
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl FromStr for QuotaSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "invalid quota {s:?}: {why} (expected `<limit>/<window>`, e.g. \"100/min\", \"10/5s\" or \"1000/calendar_month\")"
            )
        };
        let (limit, window) = s.split_once('/').ok_or_else(|| bad("no `/`"))?;
        let limit: u32 = limit
            .trim()
            .parse()
            .map_err(|_| bad("the limit is not a whole number"))?;
        if limit == 0 {
            return Err(bad("the limit is zero"));
        }
        match window.trim() {
            "calendar_day" => return Ok(Self(Quota::per_calendar_day(limit))),
            "calendar_month" => return Ok(Self(Quota::per_calendar_month(limit))),
            _ => {}
        }
        if let Some(w) = window.trim().strip_prefix("aligned_") {
            let window = parse_window(w).map_err(|e| bad(&e))?;
            if window.subsec_nanos() != 0 {
                return Err(bad("an aligned window is whole seconds"));
            }
            return Ok(Self(Quota::aligned(limit, window)));
        }
        let window = parse_window(window.trim()).map_err(|e| bad(&e))?;
        Ok(Self(Quota::new(limit, window)))
    }
}

/// `"+05:30"`, `"-08:00"`, `"Z"`: a calendar quota's offset from UTC, in seconds east.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetSpec(pub(crate) i32);

impl FromStr for OffsetSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid UTC offset {s:?} (expected `+HH:MM`, `-HH:MM` or `Z`)");
        let t = s.trim();
        if t == "Z" {
            return Ok(Self(0));
        }
        let (sign, rest) = match t.as_bytes().first() {
            Some(b'+') => (1, &t[1..]),
            Some(b'-') => (-1, &t[1..]),
            _ => return Err(bad()),
        };
        let (h, m) = rest.split_once(':').ok_or_else(bad)?;
        let two_digits = |v: &str| {
            (v.len() == 2 && v.bytes().all(|b| b.is_ascii_digit()))
                .then(|| v.parse::<i32>().ok())
                .flatten()
        };
        match (two_digits(h), two_digits(m)) {
            (Some(h), Some(m)) if h < 24 && m < 60 => Ok(Self(sign * (h * 3600 + m * 60))),
            _ => Err(bad()),
        }
    }
}

/// `"20ms"`, `"1.5s"`, `"2m"`: a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurationSpec(pub(crate) Duration);

impl FromStr for DurationSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("invalid duration {s:?}: no unit (e.g. \"20ms\", \"1s\")"))?;
        let (n, unit) = t.split_at(split);
        let n: f64 = n
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: expected a number and a unit"))?;
        let unit = unit_secs(unit.trim())
            .ok_or_else(|| format!("invalid duration {s:?}: unknown unit {unit:?}"))?;
        let d = Duration::try_from_secs_f64(n * unit)
            .map_err(|_| format!("invalid duration {s:?}: out of range"))?;
        if d.is_zero() {
            return Err(format!("invalid duration {s:?}: must be positive"));
        }
        Ok(Self(d))
    }
}

/// A window: a unit (`min`), or a count and a unit (`5s`, `10 min`).
fn parse_window(w: &str) -> Result<Duration, String> {
    let split = w
        .find(|c: char| !c.is_ascii_digit())
        .ok_or("no window unit")?;
    let (n, unit) = w.split_at(split);
    let n: u32 = if n.is_empty() {
        1
    } else {
        n.parse().map_err(|_| "the window count is too large")?
    };
    let unit = unit.trim();
    if unit == "ms" {
        return Ok(Duration::from_millis(u64::from(n)));
    }
    let secs = unit_secs(unit).ok_or_else(|| format!("unknown window unit {unit:?}"))?;
    if n == 0 {
        return Err("the window is zero".into());
    }
    // Whole-second units only: `ms` was handled above.
    Ok(Duration::from_secs(u64::from(n) * secs as u64))
}

/// Seconds per unit name.
fn unit_secs(unit: &str) -> Option<f64> {
    Some(match unit {
        "ms" => 0.001,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        _ => return None,
    })
}

/// One key source: a built-in or a name in the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyAtom {
    Header(HeaderName),
    Extension(String),
    PeerIp,
    ClientIp,
    MatchedRoute,
    Everyone,
}

/// `a|b` (a, else b) of `a+b` (both joined); `+` binds tighter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeySpec(pub(crate) Vec<Vec<KeyAtom>>);

impl KeySpec {
    pub(crate) fn uses_client_ip(&self) -> bool {
        self.0.iter().flatten().any(|a| *a == KeyAtom::ClientIp)
    }
}

impl FromStr for KeySpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let atom = |a: &str| -> Result<KeyAtom, String> {
            let a = a.trim();
            Ok(match a.split_once(':') {
                Some(("header", h)) => KeyAtom::Header(
                    HeaderName::from_bytes(h.trim().as_bytes())
                        .map_err(|_| format!("invalid header name {h:?} in key {s:?}"))?,
                ),
                Some(("extension", n)) if !n.trim().is_empty() => {
                    KeyAtom::Extension(n.trim().to_owned())
                }
                _ => match a {
                    "peer_ip" => KeyAtom::PeerIp,
                    "client_ip" => KeyAtom::ClientIp,
                    "matched_route" => KeyAtom::MatchedRoute,
                    "everyone" => KeyAtom::Everyone,
                    _ => {
                        return Err(format!(
                            "unknown key source {a:?} in key {s:?}: expected header:<name>, \
                             extension:<name>, peer_ip, client_ip, matched_route or everyone"
                        ));
                    }
                },
            })
        };
        let alts = s
            .split('|')
            .map(|alt| alt.split('+').map(atom).collect())
            .collect::<Result<_, _>>()?;
        Ok(Self(alts))
    }
}

/// `skip`, `reject:401`, `fallback:<key>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MissingSpec {
    Skip,
    Reject(StatusCode),
    Fallback(KeySpec),
}

impl FromStr for MissingSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().split_once(':') {
            None if s.trim() == "skip" => Ok(Self::Skip),
            Some(("reject", code)) => code
                .trim()
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                // A rejection is the client's fault: never a 5xx or a success.
                .filter(|c| c.is_client_error())
                .map(Self::Reject)
                .ok_or_else(|| format!("invalid on_missing_key {s:?}: reject needs a 4xx status")),
            Some(("fallback", key)) => key.parse().map(Self::Fallback),
            _ => Err(format!(
                "invalid on_missing_key {s:?}: expected skip, reject:<4xx status> or fallback:<key>"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(s: &str) -> (u32, u64) {
        let q = s.parse::<QuotaSpec>().unwrap().0;
        (q.limit(), q.window().as_millis() as u64)
    }

    #[test]
    fn quotas() {
        assert_eq!(quota("100/min"), (100, 60_000));
        assert_eq!(quota("100/m"), (100, 60_000));
        assert_eq!(quota("5/s"), (5, 1_000));
        assert_eq!(quota("5/sec"), (5, 1_000));
        assert_eq!(quota("5/second"), (5, 1_000));
        assert_eq!(quota("7/h"), (7, 3_600_000));
        assert_eq!(quota("7/hour"), (7, 3_600_000));
        assert_eq!(quota("1000/day"), (1000, 86_400_000));
        assert_eq!(quota("10/5s"), (10, 5_000));
        assert_eq!(quota(" 10 / 15 min "), (10, 900_000));
        assert_eq!(quota("3/500ms"), (3, 500));
        let cal = |s: &str| s.parse::<QuotaSpec>().unwrap().0;
        assert_eq!(cal("1000/calendar_day"), Quota::per_calendar_day(1000));
        assert_eq!(cal(" 5 / calendar_month"), Quota::per_calendar_month(5));
        let aligned = |secs| Quota::aligned(50, Duration::from_secs(secs));
        assert_eq!(cal("50/aligned_min"), aligned(60));
        assert_eq!(cal("50/aligned_minute"), aligned(60));
        assert_eq!(cal("50 / aligned_15min"), aligned(900));
        assert_eq!(cal("50/aligned_day"), aligned(86_400));
        for bad in [
            "100",
            "x/min",
            "0/min",
            "10/0s",
            "10/week",
            "10/",
            "10/aligned_500ms",
            "10/aligned_0s",
            "10/aligned_",
            "10/aligned",
        ] {
            let err = bad.parse::<QuotaSpec>().unwrap_err();
            assert!(err.starts_with(&format!("invalid quota {bad:?}")), "{err}");
        }
    }

    #[test]
    fn offsets() {
        let o = |s: &str| s.parse::<OffsetSpec>().map(|o| o.0);
        assert_eq!(o("+05:30"), Ok(19_800));
        assert_eq!(o("-08:00"), Ok(-28_800));
        assert_eq!(o("Z"), Ok(0));
        for bad in [
            "05:30",
            "+5:30",
            "+24:00",
            "+05:60",
            "+05",
            "",
            "+\u{661}1:00",
        ] {
            assert!(o(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        let d = |s: &str| s.parse::<DurationSpec>().map(|d| d.0);
        assert_eq!(d("20ms"), Ok(Duration::from_millis(20)));
        assert_eq!(d("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(d("2m"), Ok(Duration::from_secs(120)));
        assert!(d("20").unwrap_err().contains("no unit"));
        assert!(d("0ms").unwrap_err().contains("positive"));
        assert!(d("5 parsecs").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn keys() {
        let k: KeySpec = "header:X-Api-Key+matched_route|peer_ip".parse().unwrap();
        assert_eq!(
            k.0,
            vec![
                vec![
                    KeyAtom::Header(HeaderName::from_static("x-api-key")),
                    KeyAtom::MatchedRoute
                ],
                vec![KeyAtom::PeerIp]
            ]
        );
        assert!(!k.uses_client_ip());
        assert!(
            "everyone|client_ip"
                .parse::<KeySpec>()
                .unwrap()
                .uses_client_ip()
        );
        assert_eq!(
            "extension:user".parse::<KeySpec>().unwrap().0,
            vec![vec![KeyAtom::Extension("user".into())]]
        );
        assert!("header:bad header".parse::<KeySpec>().is_err());
        assert!(
            "ip".parse::<KeySpec>()
                .unwrap_err()
                .contains("unknown key source \"ip\"")
        );
    }

    #[test]
    fn missing() {
        let m = |s: &str| s.parse::<MissingSpec>();
        assert_eq!(m("skip"), Ok(MissingSpec::Skip));
        assert_eq!(
            m("reject:401"),
            Ok(MissingSpec::Reject(StatusCode::UNAUTHORIZED))
        );
        assert_eq!(
            m("fallback:peer_ip"),
            Ok(MissingSpec::Fallback(KeySpec(vec![vec![KeyAtom::PeerIp]])))
        );
        assert!(m("reject:500").is_err());
        assert!(m("reject:abc").is_err());
        assert!(m("drop").is_err());
    }

    /// No input makes a parser panic: each answers `Ok` or `Err`, and what
    /// it accepts is sane. Bounded: proptest's default 256 cases each.
    mod never_panic {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn quota_duration_key_and_missing_specs(s in "\\PC{0,40}") {
                if let Ok(q) = s.parse::<QuotaSpec>() {
                    prop_assert!(q.0.limit() > 0 && !q.0.window().is_zero());
                }
                if let Ok(d) = s.parse::<DurationSpec>() {
                    prop_assert!(d.0 < Duration::from_secs(u64::MAX / 2));
                }
                let _ = s.parse::<KeySpec>();
                let _ = s.parse::<MissingSpec>();
            }

            #[test]
            fn spec_shaped_strings(
                n in any::<u64>(),
                unit in "(s|sec|min|h|hour|d|day|ms|[a-z]{0,4})",
                sep in "(/| per |)",
                frac in proptest::option::of(0u32..1000),
            ) {
                let num = match frac { Some(f) => format!("{n}.{f}"), None => n.to_string() };
                let _ = format!("{num}{sep}{unit}").parse::<QuotaSpec>();
                let _ = format!("{num}{unit}").parse::<DurationSpec>();
                let _ = format!("reject:{n}").parse::<MissingSpec>();
            }

            #[test]
            fn whole_config_files(src in "\\PC{0,200}") {
                let _ = crate::config::RulesConfig::from_toml_str(&src);
                let _ = crate::config::RulesConfig::from_yaml_str(&src);
            }

            #[test]
            fn config_shaped_files(
                name in "[ -~]{0,12}",
                quota in "[0-9a-z/ .]{0,12}",
                key in "[a-z:_|+0-9-]{0,24}",
            ) {
                let toml = format!("[[rules]]\nname = {name:?}\nkey = {key:?}\nquota = {quota:?}\n");
                let _ = crate::config::RulesConfig::from_toml_str(&toml);
            }
        }
    }
}
