//! The answers the layer gives itself: 429, gRPC RESOURCE_EXHAUSTED, and
//! missing-key rejections; plus the trait that puts them in the inner
//! service's body type.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::headers::retry_after_secs;
use crate::key::Misconfig;

mod problem;

pub use problem::{QUOTA_EXCEEDED, problem_json};

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
    /// An any-of group's refusal: every visible member that refused, in
    /// the group's order; empty for a single rule.
    pub(crate) violated: Vec<Arc<str>>,
}

impl Denied {
    /// A refusal by `rule` for its rate, as the layer hands it to a
    /// [`deny_response`](crate::rate_limit::RateLimitBuilder::deny_response)
    /// or `grpc_message` closure: a 429 that could pass after
    /// `retry_after` (`None`: waiting would not help). For testing such a
    /// closure on its own:
    ///
    /// ```
    /// use std::time::Duration;
    /// use keyed_rate_limit::response::Denied;
    ///
    /// fn message(d: &Denied) -> String {
    ///     format!("{} says slow down; retry in {} s", d.rule(), d.retry_after_secs().unwrap_or(0))
    /// }
    /// let denied = Denied::new("per-key", Some(Duration::from_millis(1500)));
    /// assert_eq!(message(&denied), "per-key says slow down; retry in 2 s");
    /// assert_eq!(denied.status(), http::StatusCode::TOO_MANY_REQUESTS);
    /// ```
    pub fn new(rule: impl Into<Arc<str>>, retry_after: Option<Duration>) -> Self {
        Self {
            retry_after,
            ..Self::rejected(rule.into(), StatusCode::TOO_MANY_REQUESTS, None)
        }
    }

    /// A request `rule` rejects for its key (missing, or its source missing
    /// from the setup): waiting would not help.
    pub(crate) fn rejected(
        rule: Arc<str>,
        status: StatusCode,
        misconfig: Option<Misconfig>,
    ) -> Self {
        Self {
            rule,
            retry_after: None,
            status,
            hidden: false,
            misconfig,
            violated: Vec::new(),
        }
    }

    /// The rule that refused the request; for an any-of group, the member
    /// whose units come back soonest, which gives the wait.
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// The names a client may see of every rule that refused: the rule, or
    /// each refusing member of an any-of group in the group's order,
    /// without hidden ones. The default body's `violated-policies`.
    ///
    /// ```
    /// use keyed_rate_limit::response::Denied;
    /// fn body(d: &Denied) -> String {
    ///     d.violated_policies().collect::<Vec<_>>().join(", ")
    /// }
    /// # let _ = body;
    /// ```
    pub fn violated_policies(&self) -> impl Iterator<Item = &str> {
        let single = (self.violated.is_empty() && !self.hidden).then_some(&*self.rule);
        single.into_iter().chain(self.violated.iter().map(|r| &**r))
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
    /// ([`Rule::hidden(true)`](crate::rule::Rule::hidden)): the default
    /// bodies then don't name it, and a custom body should not either.
    pub fn is_hidden(&self) -> bool {
        self.hidden
    }

    /// What the refusal says in words: the problem's `detail`, and gRPC's
    /// `grpc-message`.
    pub(crate) fn detail(&self) -> String {
        // A hidden rule is not named: its limits are nobody's business.
        let name = if self.hidden {
            "a".to_owned()
        } else {
            format!("{:?}", &*self.rule)
        };
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            match self.retry_after_secs() {
                Some(s) => format!("rate limit {name} exceeded; retry in {s} s"),
                None => format!("request exceeds what rate limit {name} can ever admit"),
            }
        } else if let Some(m) = self.misconfig {
            format!("rate limit {name} is misconfigured: {}", m.public())
        } else if self.status == StatusCode::UNAUTHORIZED {
            format!(
                "credentials required: rate limit {name} counts requests by caller, and this request names none"
            )
        } else {
            format!("the request lacks what rate limit {name} counts requests by")
        }
    }

    /// 429; the status of an [`OnMissingKey::Reject`](crate::key::OnMissingKey::Reject);
    /// or 500, when the rule cannot find its key in this setup (see
    /// [`OnMissingKey`](crate::key::OnMissingKey)). The response has this
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
        static WARNED: crate::util::throttle::Throttle = crate::util::throttle::Throttle::new();
        if WARNED.ready(Duration::from_secs(60)) {
            tracing::error!(target: crate::observe::TARGET, "deny_response returned a body that is not ready at once; the refusal is sent without a body");
        }
        out.clear();
    }
    Response::from_parts(parts, out.freeze())
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

/// The challenge RFC 9110 (§11.6.1) requires of every 401: a 401 the
/// layer answers for a rule keyed by the extractor named `key`
/// ([`OnMissingKey::Reject`](crate::key::OnMissingKey::Reject)) gets one,
/// unless the deny-response closure set its own `WWW-Authenticate`. A key
/// read from a header other than `Authorization` (`header:x-api-key`)
/// names it, as `ApiKey header="x-api-key"`; any other key (the
/// `Authorization` header, an extension an auth layer sets, a closure)
/// asks for `Bearer`.
pub(crate) fn challenge(res: &mut Response<Bytes>, key: &str) {
    if res.status() != StatusCode::UNAUTHORIZED || res.headers().contains_key(WWW_AUTHENTICATE) {
        return;
    }
    let named = key
        .strip_prefix("header:")
        .filter(|h| *h != "authorization")
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        })
        .and_then(|h| HeaderValue::try_from(format!("ApiKey header=\"{h}\"")).ok());
    let value = named.unwrap_or(HeaderValue::from_static("Bearer"));
    res.headers_mut().insert(WWW_AUTHENTICATE, value);
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

/// A trailers-only gRPC response: HTTP 200 with the status in the headers,
/// and in `grpc-message` the words of the HTTP body's `detail`.
fn grpc_refusal(d: &Denied, custom: Option<&GrpcMessageFn>) -> Response<Bytes> {
    let code = if d.status == StatusCode::TOO_MANY_REQUESTS {
        grpc::RESOURCE_EXHAUSTED
    } else if d.misconfig.is_some() {
        grpc::INTERNAL
    } else {
        grpc_code(d.status)
    };
    let message = match custom {
        Some(custom) => custom(d),
        None => d.detail(),
    };
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
/// Implemented for axum's body, [`Full<Bytes>`](http_body_util::Full),
/// `http-body-util`'s boxed bodies and, **with the `tonic` feature**,
/// tonic's body (`tonic::body::Body`, what a tonic `Server` answers with).
/// Without the feature the layer on a tonic `Server` does not compile, and
/// the compiler says which feature to turn on:
///
#[cfg_attr(not(feature = "tonic"), doc = "```compile_fail,E0277")]
#[cfg_attr(feature = "tonic", doc = "```")]
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
///
/// async fn serve(addr: std::net::SocketAddr) -> Result<(), tonic::transport::Error> {
///     let limit = RateLimitLayer::builder()
///         .rule(Rule::new("per-ip", KeyExtractor::peer_ip(), Quota::per_minute(60)))
///         .build()
///         .expect("valid rules");
///     let (_, health) = tonic_health::server::health_reporter();
///     tonic::transport::Server::builder()
///         .layer(limit)
///         .add_service(health)
///         .serve(addr)
///         .await
/// }
/// ```
///
/// ```text
/// error[E0277]: the rate limiter cannot write its refusals in a `tonic::body::Body`
///    |
/// 11 |         .serve(addr)
///    |          ^^^^^ the layer's refusals need a body of this type
///    |
///    = help: the trait `RefusalBody` is not implemented for `tonic::body::Body`
///    = note: tonic's `Server` answers with `tonic::body::Body`: turn on the `tonic` feature of keyed-rate-limit (features = ["tonic"] in Cargo.toml)
///    = note: a body type of your own needs an `impl keyed_rate_limit::response::RefusalBody`
/// ```
///
/// For a body type of your own:
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
#[diagnostic::on_unimplemented(
    message = "the rate limiter cannot write its refusals in a `{Self}`",
    label = "the layer's refusals need a body of this type",
    note = "tonic's `Server` answers with `tonic::body::Body`: turn on the `tonic` feature of keyed-rate-limit (features = [\"tonic\"] in Cargo.toml)",
    note = "a body type of your own needs an `impl keyed_rate_limit::response::RefusalBody`"
)]
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
            violated: Vec::new(),
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
        assert_eq!(
            res.headers()["grpc-message"],
            "rate limit \"api\" exceeded; retry in 1 s",
            "the wait, as the HTTP detail gives it"
        );
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
