//! The answers the layer gives itself: 429, gRPC RESOURCE_EXHAUSTED, and
//! missing-key rejections; plus the trait that puts them in the inner
//! service's body type.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::headers::retry_after_secs;
use crate::key::Misconfig;

/// What the deny-response closure is told about a refused request.
///
/// ```
/// use keyed_rate_limit::response::Denied;
/// fn body(d: &Denied) -> String {
///     format!("slow down ({}), retry in {:?}", d.rule(), d.retry_after_secs())
/// }
/// # let _ = body;
/// ```
#[derive(Debug, Clone)]
pub struct Denied {
    pub(crate) rule: Arc<str>,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) status: StatusCode,
    /// The rule is kept out of the headers; the default bodies don't name it.
    pub(crate) hidden: bool,
    /// A 500: the rule's key source is missing from the setup.
    pub(crate) misconfig: Option<Misconfig>,
}

impl Denied {
    /// The rule that refused the request.
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The wait before this request could pass; `None` when waiting would
    /// not help (cost above capacity, a request-time quota that admits
    /// nothing, a rejected missing key).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The wait as sent in `Retry-After`: whole seconds, rounded up, never 0.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(retry_after_secs)
    }

    /// Whether the refusing rule is hidden from clients
    /// ([`Rule::headers(false)`](crate::Rule::headers)): the default
    /// bodies then don't name it, and a custom body should not either.
    pub fn is_hidden(&self) -> bool {
        self.hidden
    }

    /// 429; the status of an [`OnMissingKey::Reject`](crate::rule::OnMissingKey::Reject);
    /// or 500, when the rule cannot find its key in this setup (see
    /// [`OnMissingKey`](crate::rule::OnMissingKey)). The response has this
    /// status whatever the deny-response closure sets.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

pub(crate) type DenyFn = dyn Fn(&Denied) -> Response<Bytes> + Send + Sync;
pub(crate) type GrpcMessageFn = dyn Fn(&Denied) -> String + Send + Sync;

/// How a layer words its refusals: the HTTP body, and the gRPC message.
#[derive(Clone)]
pub(crate) struct Refusals {
    pub(crate) body: Arc<DenyFn>,
    pub(crate) grpc_message: Option<Arc<GrpcMessageFn>>,
}

/// A response whose body is ready at once, as bytes: any body axum makes
/// from a value is. A streaming body cannot be read without waiting, so
/// it is dropped (and logged once a minute).
pub(crate) fn ready(res: axum::response::Response) -> Response<Bytes> {
    use http_body::Body as _;
    let (parts, mut body) = res.into_parts();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut out = bytes::BytesMut::new();
    let complete = loop {
        match std::pin::Pin::new(&mut body).poll_frame(&mut cx) {
            std::task::Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            std::task::Poll::Ready(None) => break true,
            std::task::Poll::Ready(Some(Err(_))) | std::task::Poll::Pending => break false,
        }
    };
    if !complete {
        static WARNED: crate::throttle::Throttle = crate::throttle::Throttle::new();
        if WARNED.ready(Duration::from_secs(60)) {
            tracing::error!(target: crate::observe::TARGET, "deny_response returned a body that is not ready at once; the refusal is sent without a body");
        }
        out.clear();
    }
    Response::from_parts(parts, out.freeze())
}

/// The problem type a rate limit's 429 carries, registered by the RateLimit
/// header fields draft.
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// The default body: an RFC 9457 problem document.
///
/// A 429 has the draft's type [`QUOTA_EXCEEDED`], title "Quota Exceeded"
/// and `violated-policies`: the names of the rules that refused, as in the
/// `RateLimit` fields (the first refusal ends evaluation, so there is one).
/// A fail-closed refusal during a Redis outage is a 429 of this type too:
/// the draft's `temporary-reduced-capacity` type belongs with a 503, and a
/// rate limiter never answers 503. A rejected missing key (e.g. 401) is an
/// `about:blank` problem with its status's reason as title, and so is the
/// 500 of a rule that cannot find its key in this setup, whose `detail`
/// says what the request lacks (`rate limit "per-ip" is misconfigured: the
/// request has no ConnectInfo<SocketAddr>`). All keep the `rule` and
/// `retry_after` (seconds, or `null`) extension members.
///
/// ```text
/// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
///  "title":"Quota Exceeded","status":429,"detail":"rate limit \"api\" exceeded; retry in 2 s",
///  "violated-policies":["api"],"rule":"api","retry_after":2}
/// ```
pub fn problem_json(d: &Denied) -> Response<Bytes> {
    // A flood of 429s is this path: one pass, no formatting, for the names
    // that need no escaping (names are printable ASCII, so all but `"`, `\`).
    let body = if d.status == StatusCode::TOO_MANY_REQUESTS {
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
        let plain = d.hidden || !d.rule.contains(['"', '\\']);
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
    body.push_str(r#","retry_after":"#);
    match retry {
        Some(s) => body.push_str(digits.format(s)),
        None => body.push_str("null"),
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
    // A hidden rule is not named: its limits are nobody's business.
    let name = if d.hidden {
        "a".to_owned()
    } else {
        format!("{:?}", &*d.rule)
    };
    let detail = if quota {
        match d.retry_after_secs() {
            Some(s) => format!("rate limit {name} exceeded; retry in {s} s"),
            None => format!("request exceeds what rate limit {name} can ever admit"),
        }
    } else if let Some(m) = d.misconfig {
        format!("rate limit {name} is misconfigured: {m}")
    } else {
        format!("no rate-limit key for rule {name}")
    };
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
    if !d.hidden {
        if quota {
            body.push_str(r#","violated-policies":["#);
            json_str(&mut body, &d.rule);
            body.push(']');
        }
        body.push_str(r#","rule":"#);
        json_str(&mut body, &d.rule);
    }
    body.push_str(r#","retry_after":"#);
    match d.retry_after_secs() {
        Some(s) => body.push_str(itoa::Buffer::new().format(s)),
        None => body.push_str("null"),
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

/// Builds the full refusal: the user's body for HTTP, the gRPC shape for a
/// gRPC request (told by its `request` headers), with `Retry-After` and the
/// rate-limit headers.
pub(crate) fn refusal(
    deny: &Refusals,
    d: &Denied,
    request: &HeaderMap,
    mut extra: crate::headers::Rendered,
) -> Response<Bytes> {
    let mut res = if is_grpc(request) {
        grpc_refusal(d, deny.grpc_message.as_deref())
    } else {
        let mut res = (deny.body)(d);
        // The status is the limiter's contract; a body closure may not turn a 429 into a 500.
        *res.status_mut() = d.status;
        res
    };
    if let Some(secs) = d.retry_after_secs() {
        // delay-seconds (RFC 9110 §10.2.3).
        res.headers_mut()
            .insert(RETRY_AFTER, retry_after_value(secs));
    }
    crate::headers::apply(res.headers_mut(), &mut extra);
    res
}

/// `secs` as a header value; a flood repeats one, so each thread keeps its
/// last.
fn retry_after_value(secs: u64) -> HeaderValue {
    thread_local!(static LAST: std::cell::RefCell<Option<(u64, HeaderValue)>> = const { std::cell::RefCell::new(None) });
    LAST.with_borrow_mut(|last| match last {
        Some((s, v)) if *s == secs => v.clone(),
        _ => {
            let v = HeaderValue::from(secs);
            *last = Some((secs, v.clone()));
            v
        }
    })
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// A trailers-only gRPC response: HTTP 200 with the status in the headers.
fn grpc_refusal(d: &Denied, custom: Option<&GrpcMessageFn>) -> Response<Bytes> {
    let (code, mut message) = if d.status == StatusCode::TOO_MANY_REQUESTS {
        let message = if d.hidden {
            "rate limited".to_owned()
        } else {
            format!("rate limit {:?} exceeded", &*d.rule)
        };
        (grpc::RESOURCE_EXHAUSTED, message)
    } else if let Some(m) = d.misconfig {
        (
            grpc::INTERNAL,
            format!("rate limit {:?} is misconfigured: {m}", &*d.rule),
        )
    } else {
        (
            grpc_code(d.status),
            format!("no rate-limit key for rule {:?}", &*d.rule),
        )
    };
    if let Some(custom) = custom {
        message = custom(d);
    }
    let mut res = Response::new(Bytes::new());
    let h: &mut HeaderMap = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    if let Ok(v) = HeaderValue::try_from(percent_encode(&message)) {
        h.insert(GRPC_MESSAGE, v);
    }
    if let Some(wait) = d.retry_after {
        // gRFC A6: a client waits this long before its next attempt.
        // Rounded up, as Retry-After is, so an obedient client is never early.
        let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .max(1);
        h.insert(GRPC_PUSHBACK, HeaderValue::from(ms));
    }
    res
}

/// gRPC status codes (the gRPC spec's `statuscodes.md`); a refusal is only
/// headers, so it needs no gRPC crate.
mod grpc {
    pub(super) const UNKNOWN: u8 = 2;
    pub(super) const INVALID_ARGUMENT: u8 = 3;
    pub(super) const NOT_FOUND: u8 = 5;
    pub(super) const PERMISSION_DENIED: u8 = 7;
    pub(super) const RESOURCE_EXHAUSTED: u8 = 8;
    pub(super) const INTERNAL: u8 = 13;
    pub(super) const UNAVAILABLE: u8 = 14;
    pub(super) const UNAUTHENTICATED: u8 = 16;
}

/// The gRPC code for a missing-key rejection status (the gRPC HTTP mapping, reversed).
fn grpc_code(status: StatusCode) -> u8 {
    match status {
        StatusCode::UNAUTHORIZED => grpc::UNAUTHENTICATED,
        StatusCode::FORBIDDEN => grpc::PERMISSION_DENIED,
        StatusCode::BAD_REQUEST => grpc::INVALID_ARGUMENT,
        StatusCode::NOT_FOUND => grpc::NOT_FOUND,
        StatusCode::TOO_MANY_REQUESTS => grpc::RESOURCE_EXHAUSTED,
        StatusCode::SERVICE_UNAVAILABLE => grpc::UNAVAILABLE,
        StatusCode::INTERNAL_SERVER_ERROR => grpc::INTERNAL,
        _ => grpc::UNKNOWN,
    }
}

/// `grpc-message` is percent-encoded outside printable ASCII and `%`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// A response body the layer can write its own refusals in (429, the
/// gRPC refusal, a rejected missing key), so that responses keep the inner
/// service's body type: wrapping it in a body of the layer's would make
/// axum box every response once more.
///
/// Implemented for axum's and tonic's bodies, [`Full<Bytes>`] and
/// `http-body-util`'s boxed bodies. For a body type of your own:
///
/// ```
/// use bytes::Bytes;
/// use keyed_rate_limit::response::RefusalBody;
///
/// struct MyBody(Bytes);
///
/// impl RefusalBody for MyBody {
///     fn from_refusal(body: Bytes) -> Self {
///         MyBody(body)
///     }
/// }
/// assert_eq!(MyBody::from_refusal(Bytes::from("slow down")).0, "slow down");
/// ```
pub trait RefusalBody {
    /// A body holding `body`, the refusal's whole content.
    fn from_refusal(body: Bytes) -> Self;
}

impl RefusalBody for axum::body::Body {
    fn from_refusal(body: Bytes) -> Self {
        body.into()
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl RefusalBody for tonic::body::Body {
    fn from_refusal(body: Bytes) -> Self {
        Self::new(Full::new(body))
    }
}

impl RefusalBody for Full<Bytes> {
    fn from_refusal(body: Bytes) -> Self {
        Full::new(body)
    }
}

impl<E: 'static> RefusalBody for http_body_util::combinators::BoxBody<Bytes, E> {
    fn from_refusal(body: Bytes) -> Self {
        Full::new(body).map_err(|never| match never {}).boxed()
    }
}

impl<E: 'static> RefusalBody for http_body_util::combinators::UnsyncBoxBody<Bytes, E> {
    fn from_refusal(body: Bytes) -> Self {
        Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(grpc: bool) -> HeaderMap {
        let mut h = HeaderMap::new();
        if grpc {
            h.insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/grpc+proto"),
            );
        }
        h
    }

    fn defaults() -> Refusals {
        Refusals {
            body: Arc::new(problem_json),
            grpc_message: None,
        }
    }

    fn denied(wait: Option<Duration>) -> Denied {
        Denied {
            rule: "api".into(),
            retry_after: wait,
            status: StatusCode::TOO_MANY_REQUESTS,
            hidden: false,
            misconfig: None,
        }
    }

    #[test]
    fn http_refusal_has_problem_json_and_rounded_retry_after() {
        let res = refusal(
            &defaults(),
            &denied(Some(Duration::from_millis(1001))),
            &request(false),
            Default::default(),
        );
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["retry-after"], "2");
        assert_eq!(res.headers()[CONTENT_TYPE], "application/problem+json");
    }

    #[test]
    fn grpc_refusal_is_trailers_only_resource_exhausted() {
        let res = refusal(
            &defaults(),
            &denied(Some(Duration::from_micros(1500))),
            &request(true),
            Default::default(),
        );
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(
            res.headers()["grpc-retry-pushback-ms"],
            "2",
            "1.5 ms rounds up"
        );
        assert_eq!(res.headers()["retry-after"], "1");
        assert_eq!(res.headers()["grpc-message"], "rate limit \"api\" exceeded");
    }

    /// Our numbers are tonic's, where tonic is at hand to compare.
    #[cfg(feature = "tonic")]
    #[test]
    fn grpc_codes_match_tonic() {
        use tonic::Code;
        for (ours, theirs) in [
            (grpc::UNKNOWN, Code::Unknown),
            (grpc::INVALID_ARGUMENT, Code::InvalidArgument),
            (grpc::NOT_FOUND, Code::NotFound),
            (grpc::PERMISSION_DENIED, Code::PermissionDenied),
            (grpc::RESOURCE_EXHAUSTED, Code::ResourceExhausted),
            (grpc::INTERNAL, Code::Internal),
            (grpc::UNAVAILABLE, Code::Unavailable),
            (grpc::UNAUTHENTICATED, Code::Unauthenticated),
        ] {
            assert_eq!(i32::from(ours), theirs as i32);
        }
    }

    #[test]
    fn problem_json_escapes_and_parses() {
        let d = Denied {
            rule: r#"a "quoted" \ rule"#.into(),
            retry_after: Some(Duration::from_millis(1500)),
            status: StatusCode::TOO_MANY_REQUESTS,
            hidden: false,
            misconfig: None,
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
        assert!(v["retry_after"].is_null());
        let mut s = String::new();
        json_str(&mut s, "\u{1}\n");
        assert_eq!(s, r#""\u0001\u000a""#);
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

    #[test]
    fn a_body_is_read_at_once_or_dropped() {
        let said = axum::response::IntoResponse::into_response((StatusCode::IM_A_TEAPOT, "hi"));
        let res = ready(said);
        assert_eq!(
            (res.status(), &res.body()[..]),
            (StatusCode::IM_A_TEAPOT, &b"hi"[..])
        );
        let stream = futures_util::stream::pending::<Result<Bytes, std::io::Error>>();
        let streaming = axum::response::Response::new(axum::body::Body::from_stream(stream));
        assert!(ready(streaming).body().is_empty());
    }

    #[test]
    fn no_retry_after_when_waiting_cannot_help() {
        let res = refusal(
            &defaults(),
            &denied(None),
            &request(true),
            Default::default(),
        );
        assert!(res.headers().get("retry-after").is_none());
        assert!(res.headers().get("grpc-retry-pushback-ms").is_none());
        assert_eq!(grpc_code(StatusCode::UNAUTHORIZED), grpc::UNAUTHENTICATED);
        assert_eq!(percent_encode("é%"), "%C3%A9%25");
    }
}
