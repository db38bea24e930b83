//! The default refusal body: an RFC 9457 problem document, written by
//! hand (a few strings and two numbers need no JSON crate), in one pass for
//! the 429s a flood repeats.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use super::Denied;

/// The problem type a rate limit's 429 carries, registered by the RateLimit
/// header fields draft.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The default body: an RFC 9457 problem document.
///
/// A 429 has the draft's type [`QUOTA_EXCEEDED`], title "Quota Exceeded"
/// and `violated-policies`: the names of the rules that refused, as in the
/// `RateLimit` fields (the first refusal ends evaluation, so there is one
/// rule, or every member of an any-of group, in the group's order). A
/// fail-closed refusal during a Redis outage is a 429 of this type too:
/// the draft's `temporary-reduced-capacity` type belongs with a 503, and a
/// rate limiter never answers 503.
///
/// A rejected missing key (e.g. 401) is an `about:blank` problem with its
/// status's reason as title, and so is the 500 of a rule that cannot find
/// its key in this setup, whose `detail` says what is wrong in words a
/// client may read (`rate limit "per-ip" is misconfigured: the server does
/// not record client addresses`): the Rust types and the fix go to the
/// server's log, not to clients.
///
/// All name the refusing `rule` (unless it is hidden), and carry
/// `retry_after`, the seconds to wait, when waiting helps: never on a 401
/// or a 500, nor on a 429 whose cost no quota can ever admit. The two
/// spellings are on purpose: `violated-policies` is the member the
/// RateLimit draft registers for its problem type, and the crate's own
/// members follow RFC 9457 §3.2, which asks for letters, digits and `_`
/// so that they carry over to formats other than JSON.
///
/// ```text
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Quota Exceeded","status":429,"detail":"rate limit \"api\" exceeded; retry in 2 s",
///  "violated-policies":["api"],"rule":"api","retry_after":2}
/// ```
pub fn problem_json(d: &Denied) -> Response<Bytes> {
    // A flood of 429s is this path: one pass, no formatting, for the names
    // that need no escaping (names are printable ASCII, so all but `"`, `\`).
    let body = if d.status == StatusCode::TOO_MANY_REQUESTS && d.violated.is_empty() {
        cached_quota_body(d)
    } else {
        Bytes::from(any_body(d))
    };
    let mut res = Response::new(body);
    *res.status_mut() = d.status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res
}

/// A flood of 429s of one rule repeats one body while the wait, in whole
/// seconds, stays the same: each thread keeps its last one.
fn cached_quota_body(d: &Denied) -> Bytes {
    type Last = Option<(Arc<str>, bool, Option<u64>, Bytes)>;
    thread_local!(static LAST: std::cell::RefCell<Last> = const { std::cell::RefCell::new(None) });
    let secs = d.retry_after_secs();
    LAST.with_borrow_mut(|last| {
        if let Some((rule, hidden, s, body)) = last
            && *hidden == d.hidden
            && *s == secs
            && **rule == *d.rule
        {
            return body.clone();
        }
        let plain = d.violated.is_empty() && (d.hidden || !d.rule.contains(['"', '\\']));
        let body = Bytes::from(if plain { quota_body(d) } else { any_body(d) });
        *last = Some((d.rule.clone(), d.hidden, secs, body.clone()));
        body
    })
}

/// A 429's body, the same bytes as [`any_body`] writes for it.
fn quota_body(d: &Denied) -> String {
    let mut body = String::with_capacity(256 + 3 * d.rule.len());
    body.push_str(concat!(
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
        r#""title":"Quota Exceeded","status":429,"detail":""#
    ));
    let retry = d.retry_after_secs();
    body.push_str(match retry {
        Some(_) => "rate limit ",
        None => "request exceeds what rate limit ",
    });
    if d.hidden {
        body.push('a');
    } else {
        // The name as `{:?}` writes it, then JSON-escaped: \"name\".
        body.push_str(r#"\""#);
        body.push_str(&d.rule);
        body.push_str(r#"\""#);
    }
    let mut digits = itoa::Buffer::new();
    match retry {
        Some(s) => {
            body.push_str(" exceeded; retry in ");
            body.push_str(digits.format(s));
            body.push_str(" s\"");
        }
        None => body.push_str(" can ever admit\""),
    }
    if !d.hidden {
        body.push_str(r#","violated-policies":[""#);
        body.push_str(&d.rule);
        body.push_str(r#""],"rule":""#);
        body.push_str(&d.rule);
        body.push('"');
    }
    if let Some(s) = retry {
        body.push_str(r#","retry_after":"#);
        body.push_str(digits.format(s));
    }
    body.push('}');
    body
}

/// Any refusal's body.
fn any_body(d: &Denied) -> String {
    let quota = d.status == StatusCode::TOO_MANY_REQUESTS;
    let (kind, title) = if quota {
        (QUOTA_EXCEEDED, "Quota Exceeded")
    } else {
        (
            "about:blank",
            d.status.canonical_reason().unwrap_or("Rejected"),
        )
    };
    let detail = d.detail();
    // Written by hand: a few strings and two numbers don't need a JSON crate.
    let mut body = String::with_capacity(200 + detail.len() + 3 * d.rule.len());
    body.push_str(r#"{"type":"#);
    json_str(&mut body, kind);
    body.push_str(r#","title":"#);
    json_str(&mut body, title);
    body.push_str(r#","status":"#);
    body.push_str(itoa::Buffer::new().format(d.status.as_u16()));
    body.push_str(r#","detail":"#);
    json_str(&mut body, &detail);
    if quota {
        let mut names = d.violated_policies().peekable();
        if names.peek().is_some() {
            body.push_str(r#","violated-policies":["#);
            for (i, n) in names.enumerate() {
                if i > 0 {
                    body.push(',');
                }
                json_str(&mut body, n);
            }
            body.push(']');
        }
    }
    if !d.hidden {
        body.push_str(r#","rule":"#);
        json_str(&mut body, &d.rule);
    }
    if let Some(s) = d.retry_after_secs() {
        body.push_str(r#","retry_after":"#);
        body.push_str(itoa::Buffer::new().format(s));
    }
    body.push('}');
    body
}

/// `s` as a JSON string (RFC 8259 escapes), copied in runs between the
/// characters that need one.
fn json_str(out: &mut String, s: &str) {
    use std::fmt::Write;
    out.push('"');
    let mut run = 0;
    for (i, c) in s.char_indices() {
        let escaped = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            c if c < ' ' => "",
            _ => continue,
        };
        out.push_str(&s[run..i]);
        if escaped.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(escaped);
        }
        run = i + c.len_utf8();
    }
    out.push_str(&s[run..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn problem_json_escapes_and_parses() {
        let d = Denied {
            rule: r#"a "quoted" \ rule"#.into(),
            retry_after: Some(Duration::from_millis(1500)),
            status: StatusCode::TOO_MANY_REQUESTS,
            hidden: false,
            misconfig: None,
            violated: Vec::new(),
        };
        let res = problem_json(&d);
        let v: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
        assert_eq!(v["rule"], r#"a "quoted" \ rule"#);
        assert_eq!(v["status"], 429);
        assert_eq!(v["retry_after"], 2);
        assert_eq!(v["title"], "Quota Exceeded");
        assert_eq!(v["type"], QUOTA_EXCEEDED);
        assert_eq!(
            v["violated-policies"],
            serde_json::json!([r#"a "quoted" \ rule"#])
        );
        let missing = Denied {
            status: StatusCode::UNAUTHORIZED,
            ..d.clone()
        };
        let v: serde_json::Value = serde_json::from_slice(problem_json(&missing).body()).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["title"].as_str()),
            (Some("about:blank"), Some("Unauthorized"))
        );
        assert!(v.get("violated-policies").is_none());
        let never = Denied {
            retry_after: None,
            ..d
        };
        let v: serde_json::Value = serde_json::from_slice(problem_json(&never).body()).unwrap();
        assert!(v.get("retry_after").is_none(), "no wait helps");
        let mut s = String::new();
        json_str(&mut s, "\u{1}\n");
        assert_eq!(s, r#""\u0001\u000a""#);
    }

    #[test]
    fn a_group_names_every_visible_member_that_refused_in_order() {
        let d = Denied {
            rule: "burst-pool".into(),
            retry_after: Some(Duration::from_secs(60)),
            status: StatusCode::TOO_MANY_REQUESTS,
            hidden: false,
            misconfig: None,
            violated: vec!["steady".into(), "burst-pool".into()],
        };
        let v: serde_json::Value = serde_json::from_slice(problem_json(&d).body()).unwrap();
        assert_eq!(
            v["violated-policies"],
            serde_json::json!(["steady", "burst-pool"])
        );
        assert_eq!(v["rule"], "burst-pool");
    }

    #[test]
    fn the_quota_fast_path_writes_the_same_bytes() {
        for hidden in [false, true] {
            for wait in [Some(Duration::from_millis(1500)), None] {
                for rule in ["api", "per key:1", "a'b"] {
                    let d = Denied {
                        rule: rule.into(),
                        retry_after: wait,
                        status: StatusCode::TOO_MANY_REQUESTS,
                        hidden,
                        misconfig: None,
                        violated: Vec::new(),
                    };
                    assert_eq!(quota_body(&d), any_body(&d), "{d:?}");
                }
            }
        }
    }

    #[test]
    fn the_kept_body_is_only_reused_for_the_same_rule_and_wait() {
        let d = |rule: &str, ms| Denied {
            rule: rule.into(),
            retry_after: Some(Duration::from_millis(ms)),
            status: StatusCode::TOO_MANY_REQUESTS,
            hidden: false,
            misconfig: None,
            violated: Vec::new(),
        };
        for (a, b) in [("api", "api"), ("api", "web"), ("web", "api")] {
            for (x, y) in [(1500, 1800), (1500, 2500)] {
                let (first, second) = (d(a, x), d(b, y));
                assert_eq!(
                    problem_json(&first).into_body(),
                    Bytes::from(quota_body(&first))
                );
                assert_eq!(
                    problem_json(&second).into_body(),
                    Bytes::from(quota_body(&second))
                );
            }
        }
    }
}
