//! Several rules' rate calls in one (`multi.lua`): how the rate-limit
//! service decides a request's global descriptors on one Redis together,
//! and the reply split back into each call's decision.

use super::args::{Eval, Packed};
use super::rate::{BatchKeys, Decided, Previous, Target, decided, layout, rate_args, write_keys};
use super::sources;

/// One request of one rule, as it goes in a [`multi`] call.
pub(crate) struct Part<'a> {
    pub(crate) target: Target<'a>,
    pub(crate) keys: BatchKeys,
    pub(crate) cost: u32,
    pub(crate) previous: Option<Previous>,
}

/// `parts` as one call of `multi.lua`, and the values in each part's
/// reply. `KEYS` holds every part's keys, in order; `ARGV[1]` is the count
/// of parts, then per part its rate script's place in [`sources::MULTI`],
/// its key count and its arguments packed in one (as [`rate`](super::rate)
/// writes them, each followed by a space).
pub(crate) fn multi(parts: &[Part<'_>]) -> (Eval, smallvec::SmallVec<[usize; 4]>) {
    let layouts: smallvec::SmallVec<[(bool, usize); 4]> = (parts.iter())
        .map(|p| {
            layout(
                std::slice::from_ref(&p.keys),
                p.previous.as_ref(),
                p.target.locks,
            )
        })
        .collect();
    let keys: usize = layouts.iter().map(|(_, stride)| stride).sum();
    let bytes: usize = (parts.iter())
        .map(|p| p.keys.0.len() + p.keys.1.as_ref().map_or(0, Vec::len) + 96)
        .sum();
    let (script, source) = &*sources::MULTI;
    let mut eval = Eval::new(script, source, keys, (keys + 1 + 3 * parts.len(), bytes));
    for (p, &(declared, _)) in parts.iter().zip(&layouts) {
        write_keys(&mut eval, &p.keys, declared);
    }
    eval.arg(parts.len());
    let mut args = Packed(Vec::with_capacity(128));
    let widths = (parts.iter().zip(&layouts))
        .map(|(p, &(_, stride))| {
            let Target {
                algorithm,
                quota,
                locks,
                ..
            } = p.target;
            let multi = sources::of(algorithm, quota.period().is_some()).multi;
            eval.arg(multi).arg(stride);
            let items = [(0, p.cost)];
            // One unit of one key is the script's default.
            let items = (p.cost != 1).then_some(&items[..]);
            args.0.clear();
            let width = rate_args(&mut args, quota, locks, stride, p.previous, items);
            eval.arg(&args.0[..]);
            width
        })
        .collect();
    (eval, widths)
}

/// `multi.lua`'s reply: one string, each part's values separated by
/// spaces, the parts by `;`.
pub(crate) fn replies(
    reply: &redis::Value,
    parts: &[Part<'_>],
    widths: &[usize],
) -> Option<Vec<Decided>> {
    let redis::Value::BulkString(text) = reply else {
        return None;
    };
    let mut calls = std::str::from_utf8(text).ok()?.split(';');
    let decided = parts.iter().zip(widths).map(|(p, &width)| {
        let mut values = calls.next()?.split_ascii_whitespace().map(integer);
        let mut next = || values.next().flatten();
        let reply = (next()?, next()?, next()?);
        let window = if width > 3 { Some(next()?) } else { None };
        values
            .next()
            .is_none()
            .then(|| decided(p.target.quota, reply, window))
    });
    let decided = decided.collect::<Option<Vec<_>>>()?;
    calls.next().is_none().then_some(decided)
}

/// A Lua number as Redis replies it: an integer, truncated.
fn integer(v: &str) -> Option<i64> {
    v.parse().ok().or_else(|| {
        v.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(|f| f as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::quota::Quota;

    #[test]
    fn a_reply_splits_into_each_parts_decision_or_fails_whole() {
        let minute = Quota::per_minute(10);
        let part = |quota| Part {
            target: Target::unlocked("r", Algorithm::Gcra, quota),
            keys: (b"k".to_vec(), None, Vec::new()),
            cost: 1,
            previous: None,
        };
        let parts = [part(&minute), part(&minute)];
        // The second part's width is a calendar month's: its reply carries
        // the window's length.
        let reply = |s: &str| redis::Value::BulkString(s.as_bytes().to_vec());
        let got = replies(&reply("9 0 6000;-1 250.7 1000 3600"), &parts, &[3, 4]).unwrap();
        assert_eq!(got[0].decision.remaining(), 9);
        let retry = got[1].decision.retry_after();
        assert_eq!(
            retry,
            Some(std::time::Duration::from_millis(250)),
            "truncated"
        );
        assert_eq!(
            got[1].decision.window(),
            std::time::Duration::from_secs(3600)
        );
        for short in [
            "9 0 6000",
            "9 0 6000;-1 250 1000",
            "9 0;-1 2 3 4",
            "9 0 6000 1;-1 2 3 4",
        ] {
            assert!(replies(&reply(short), &parts, &[3, 4]).is_none(), "{short}");
        }
        assert!(replies(&reply("9 x 6000;-1 2 3 4"), &parts, &[3, 4]).is_none());
        assert!(replies(&redis::Value::Int(1), &parts, &[3, 4]).is_none());
    }

    #[test]
    fn parts_pack_their_arguments_after_every_key() {
        let minute = Quota::per_minute(10);
        let part = |key: &[u8], cost| Part {
            target: Target::unlocked("r", Algorithm::Gcra, &minute),
            keys: (key.to_vec(), None, Vec::new()),
            cost,
            previous: None,
        };
        let (eval, widths) = multi(&[part(b"k1", 1), part(b"k2", 3)]);
        assert_eq!(widths.as_slice(), [3, 3]);
        let args: Vec<Vec<u8>> = (eval.cmd.args_iter())
            .filter_map(|a| match a {
                redis::Arg::Simple(a) => Some(a.to_vec()),
                _ => None,
            })
            .collect();
        let text = |i: usize| String::from_utf8(args[i].clone()).unwrap();
        // EVALSHA, the hash, 2 keys, the keys, 2 parts, then each part's three.
        assert_eq!(
            (text(2), text(3), text(4), text(5)),
            ("2".into(), "k1".into(), "k2".into(), "2".into())
        );
        assert_eq!(args.len(), 6 + 2 * 3);
        // The limit, window and burst first; one unit of its key is the
        // script's default, another cost a (key 1, cost) pair at the end.
        assert!(
            text(8).starts_with("10 60000000 10 0 0 1 1 1 "),
            "{}",
            text(8)
        );
        assert!(text(8).ends_with(" 0 1 0 "), "{}", text(8));
        assert!(text(11).ends_with(" 0 1 0 1 3 "), "{}", text(11));
    }
}
