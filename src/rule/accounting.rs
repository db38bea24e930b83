//! Counting by the response: what a rule settles once the response head
//! is in ([`Rule::count_if`], [`Rule::cost_from_response`]).

use std::sync::Arc;

use super::Rule;

type CountIfFn = dyn Fn(&http::response::Parts) -> bool + Send + Sync;
type ResponseCostFn = dyn Fn(&http::response::Parts) -> u32 + Send + Sync;

/// What a rule settles on the response: the units reserved when the
/// request was decided are kept, given back or charged again by these
/// (ADR 13). Neither set: the rule settles nothing.
#[derive(Clone, Default)]
pub(crate) struct Accounting {
    pub(crate) count_if: Option<Arc<CountIfFn>>,
    pub(crate) cost_from_response: Option<Arc<ResponseCostFn>>,
}

impl Rule {
    /// Keeps the units a request spent only when `f` holds for its
    /// response head, e.g. a login rule that counts failed attempts only.
    ///
    /// The units are **reserved** when the request is decided, as for any
    /// rule, and given back when the response head says `f` is false: so a
    /// burst of concurrent requests can never overshoot the quota (an
    /// attacker controls concurrency), and a request that would not count
    /// holds its unit only while it is in flight. A request that never
    /// gets a response head (its client went away once the handler was
    /// called, or the inner service returned `Err`) keeps its reservation:
    /// the handler may have done its work, and a client must not be able to
    /// start work for free by hanging up. So does a panic in `f` (logged as
    /// an error; nothing else is affected). Needs a request cost
    /// of at least 1 (the build checks a fixed one; a `cost_fn` that gives 0
    /// skips the rule, settlement included).
    ///
    /// `f` sees the status and headers the inner service answered with,
    /// before the body. For gRPC that is `grpc-status` only on a
    /// trailers-only response (how tonic answers an error returned before
    /// any message, e.g. from an interceptor or a unary handler); a status
    /// sent in trailers after a streamed body is not seen.
    ///
    /// ```
    /// use http::StatusCode;
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// // Five failed logins a minute per user; successful ones are free.
    /// let login = Rule::new("login", KeyExtractor::header("x-user"), Quota::per_minute(5))
    ///     .count_if(|res| matches!(res.status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN));
    /// # let _ = login;
    /// ```
    pub fn count_if<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    {
        self.accounting.count_if = Some(Arc::new(f));
        self
    }

    /// Charges what the response says a request cost, e.g. the tokens an
    /// LLM handler reports in a header. The request's cost (`cost` or
    /// `cost_fn`, 1 by default) is reserved when it is decided; when the
    /// response head arrives, the difference is charged or given back. A
    /// charge past the bucket saturates it (the next request waits as after
    /// a full burst), never errors; a denied request is never charged. A
    /// panic in `f` keeps the reservation. With [`count_if`](Self::count_if)
    /// too, a response `count_if` refuses costs nothing.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, Rule};
    /// let tokens = Rule::new("tokens", KeyExtractor::header("x-api-key"), Quota::per_minute(100_000))
    ///     .cost_from_response(|res| {
    ///         res.headers.get("x-tokens-used")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     });
    /// # let _ = tokens;
    /// ```
    pub fn cost_from_response<F>(mut self, f: F) -> Self
    where
        F: Fn(&http::response::Parts) -> u32 + Send + Sync + 'static,
    {
        self.accounting.cost_from_response = Some(Arc::new(f));
        self
    }
}
