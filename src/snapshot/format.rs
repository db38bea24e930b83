//! The version-1 text format: written in one pass, read whole and checked
//! before anything is restored.

use std::io::{Read, Write};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Saved, SavedRule, SnapshotError, VERSION};
use crate::key::Key;
use crate::quota::{Period, Quota};

const HEADER: &str = "keyed-rate-limit snapshot";

/// Writes `rules` as read at `now` (unix µs).
pub(crate) fn write(mut w: impl Write, rules: &[SavedRule], now: i64) -> Result<(), SnapshotError> {
    let mut body = String::new();
    let mut line = |s: String| {
        body.push_str(&s);
        body.push('\n');
    };
    line(format!("{HEADER} {VERSION}"));
    line(format!("written {now}"));
    for r in rules {
        let name = hex(r.name.as_bytes());
        match &r.state {
            Saved::Rolling {
                limit,
                window_ns,
                burst,
                keys,
            } => {
                line(format!("rule {name} rolling {limit} {window_ns} {burst}"));
                for (k, whole_at) in keys {
                    line(format!("key {} {whole_at}", hex(k.as_bytes())));
                }
            }
            Saved::Calendar { quota: q, keys } => {
                let (limit, offset) = (q.limit(), q.utc_offset());
                line(match q.period() {
                    Some(Period::Aligned) => format!(
                        "rule {name} calendar {limit} aligned {offset} {}",
                        q.window().as_secs()
                    ),
                    p => format!(
                        "rule {name} calendar {limit} {} {offset}",
                        p.map_or("", Period::as_str)
                    ),
                });
                for (k, count, end) in keys {
                    line(format!("key {} {count} {end}", hex(k.as_bytes())));
                }
            }
        }
    }
    let lines = body.lines().count();
    let sum = hex(&Sha256::digest(body.as_bytes()));
    body.push_str(&format!("end {lines} {sum}\n"));
    w.write_all(body.as_bytes())?;
    Ok(w.flush()?)
}

/// Reads a whole snapshot: its rules, and when it was written (unix µs).
pub(crate) fn read(mut r: impl Read) -> Result<(Vec<SavedRule>, i64), SnapshotError> {
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes)?;
    let corrupt = |line, what| SnapshotError::Corrupt { line, what };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return Err(match bytes.starts_with(HEADER.as_bytes()) {
            true => corrupt(0, "not UTF-8"),
            false => SnapshotError::NotASnapshot,
        });
    };
    let mut lines = text.lines();
    let version = lines
        .next()
        .and_then(|l| l.strip_prefix(HEADER))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .ok_or(SnapshotError::NotASnapshot)?;
    if version != VERSION {
        return Err(SnapshotError::Version(version));
    }
    // The `end` line checks every byte before it, and is itself exactly
    // `end <lines> <sha256>\n`: a lost or changed last byte is damage too.
    let Some(last) = text.strip_suffix('\n') else {
        return Err(corrupt(
            text.lines().count(),
            "the file does not end in a newline: truncated?",
        ));
    };
    let Some(at) = last.rfind('\n').map(|i| i + 1) else {
        return Err(corrupt(1, "no end line"));
    };
    let (body, end) = (&text[..at], &last[at..]);
    let n = body.lines().count();
    let mut fields = end.split(' ');
    let (Some("end"), Some(count), Some(sum), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(corrupt(
            n + 1,
            "the last line is not `end <lines> <sha256>`: truncated?",
        ));
    };
    if count.parse() != Ok(n) || sum != hex(&Sha256::digest(body.as_bytes())) {
        return Err(corrupt(
            n + 1,
            "the end line does not match what comes before it",
        ));
    }
    let mut rules: Vec<SavedRule> = Vec::new();
    let mut written = None;
    for (i, l) in body.lines().enumerate().skip(1) {
        let no = i + 1;
        let f: Vec<&str> = l.split(' ').collect();
        // A quota's limit, window and burst: never zero.
        let positive = |s: &str| match number::<u64>(s, no)? {
            0 => Err(corrupt(no, "a quota of zero")),
            n => Ok(n),
        };
        let positive32 =
            |s: &str| u32::try_from(positive(s)?).map_err(|_| corrupt(no, "a number is malformed"));
        match f.as_slice() {
            ["written", t] => written = Some(number(t, no)?),
            ["rule", name, "rolling", limit, window, burst] => rules.push(SavedRule {
                name: text_of(name).ok_or(corrupt(no, "a rule name is not hex of UTF-8"))?,
                state: Saved::Rolling {
                    limit: positive32(limit)?,
                    window_ns: positive(window)?,
                    burst: positive32(burst)?,
                    keys: Vec::new(),
                },
            }),
            ["rule", name, "calendar", limit, period, offset, window @ ..] => {
                let limit = positive32(limit)?;
                let quota = match (*period, window) {
                    ("day", []) => Quota::per_calendar_day(limit),
                    ("month", []) => Quota::per_calendar_month(limit),
                    ("aligned", [secs]) => {
                        Quota::aligned(limit, Duration::from_secs(positive(secs)?))
                    }
                    _ => return Err(corrupt(no, "an unknown calendar period")),
                };
                let offset = i32::try_from(number::<i64>(offset, no)?)
                    .map_err(|_| corrupt(no, "an offset out of range"))?;
                rules.push(SavedRule {
                    name: text_of(name).ok_or(corrupt(no, "a rule name is not hex of UTF-8"))?,
                    state: Saved::Calendar {
                        quota: quota.with_utc_offset(offset),
                        keys: Vec::new(),
                    },
                });
            }
            ["key", key, rest @ ..] => {
                let key = Key::from(unhex(key).ok_or(corrupt(no, "a key is not hex"))?);
                match (rules.last_mut().map(|r| &mut r.state), rest) {
                    (Some(Saved::Rolling { keys, .. }), [whole_at]) => {
                        keys.push((key, number(whole_at, no)?))
                    }
                    (Some(Saved::Calendar { keys, .. }), [count, end]) => {
                        keys.push((key, number(count, no)?, number(end, no)?));
                    }
                    _ => return Err(corrupt(no, "a key line that fits no rule line before it")),
                }
            }
            _ => return Err(corrupt(no, "an unknown record")),
        }
    }
    Ok((rules, written.ok_or(corrupt(2, "no `written` line"))?))
}

/// A number on line `line`.
fn number<T: std::str::FromStr>(s: &str, line: usize) -> Result<T, SnapshotError> {
    let what = "a number is malformed";
    s.parse().map_err(|_| SnapshotError::Corrupt { line, what })
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn text_of(s: &str) -> Option<String> {
    String::from_utf8(unhex(s)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<SavedRule> {
        vec![
            SavedRule {
                name: "per key".into(),
                state: Saved::Rolling {
                    limit: 100,
                    window_ns: 3_600_000_000_000,
                    burst: 20,
                    keys: vec![(Key::from(vec![0u8, 0xff, b' ']), 1_700_000_000_000_000)],
                },
            },
            SavedRule {
                name: "monthly".into(),
                state: Saved::Calendar {
                    quota: Quota::per_calendar_month(10).with_utc_offset(-3600),
                    keys: vec![(Key::from("k"), 3, 1_700_000_000)],
                },
            },
            SavedRule {
                name: "per aligned minute".into(),
                state: Saved::Calendar {
                    quota: Quota::aligned(50, Duration::from_secs(60)).with_utc_offset(1800),
                    keys: vec![(Key::from("k"), 50, 1_700_000_040)],
                },
            },
        ]
    }

    #[test]
    fn round_trips_binary_keys_and_every_kind() {
        let mut out = Vec::new();
        write(&mut out, &sample(), 42).unwrap();
        assert_eq!(read(&out[..]).unwrap(), (sample(), 42));
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(" calendar 10 month -3600\n"), "{text}");
        assert!(text.contains(" calendar 50 aligned 1800 60\n"), "{text}");
    }

    #[test]
    fn corrupt_truncated_and_foreign_files_are_errors() {
        let mut out = Vec::new();
        write(&mut out, &sample(), 42).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        let err = |b: &[u8]| read(b).unwrap_err().to_string();
        // Every truncation fails, none panics.
        for cut in 0..out.len() {
            assert!(read(&out[..cut]).is_err(), "cut at {cut}");
        }
        // The end line's newline lost, doubled or changed to other white space.
        let body = &text[..text.len() - 1];
        for tail in ["", "\n\n", "\t", "\x0b", "\x0c", "\r", " ", "\r\n", " \n"] {
            let damaged = format!("{body}{tail}");
            assert!(read(damaged.as_bytes()).is_err(), "ending {tail:?}");
        }
        // A flipped digit fails the checksum.
        let flipped = text.replacen("100", "900", 1);
        assert!(err(flipped.as_bytes()).contains("does not match"));
        assert_eq!(err(b"{\"json\": true}"), "not a keyed-rate-limit snapshot");
        assert!(matches!(
            read(&[0xff, 0xfe][..]),
            Err(SnapshotError::NotASnapshot)
        ));
        let later = text.replacen("snapshot 1", "snapshot 2", 1);
        assert!(matches!(
            read(later.as_bytes()),
            Err(SnapshotError::Version(2))
        ));
        // Whole and checked, but a quota that admits nothing: refused.
        let mut zero = sample();
        if let Saved::Rolling { limit, .. } = &mut zero[0].state {
            *limit = 0;
        }
        let mut out = Vec::new();
        write(&mut out, &zero, 42).unwrap();
        assert!(err(&out).contains("a quota of zero"), "{}", err(&out));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any names and binary keys come back as written; any byte
            /// changed or cut is an error, never a panic or a silent load.
            #[test]
            fn round_trips_and_refuses_any_damage(
                name in "\\PC{1,12}",
                keys in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..24), any::<i64>()), 0..6),
                at in any::<proptest::sample::Index>(),
                flip in 1u8..=255,
            ) {
                let rules = vec![SavedRule {
                    name,
                    state: Saved::Rolling {
                        limit: 10,
                        window_ns: 1_000_000_000,
                        burst: 10,
                        keys: keys.into_iter().map(|(k, t)| (Key::from(k), t)).collect(),
                    },
                }];
                let mut out = Vec::new();
                write(&mut out, &rules, 7).unwrap();
                prop_assert_eq!(read(&out[..]).unwrap(), (rules, 7));
                let i = at.index(out.len());
                let mut damaged = out.clone();
                damaged[i] ^= flip;
                prop_assert!(read(&damaged[..]).is_err());
                prop_assert!(read(&out[..i]).is_err());
            }
        }
    }
}
