#![doc = include_str!("../../docs/concurrency.md")]

mod backend;
mod body;
mod future;
#[cfg(feature = "redis")]
mod lease;
mod service;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::StatusCode;
use http::request::Parts;
use tower::Layer;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use service::ConcurrencyLimitService;

#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, validate_global};
use crate::error::BuildError;
#[cfg(feature = "redis")]
use crate::failure::{FailurePolicy, Guard};
use crate::headers::StaticPolicy;
use crate::key::KeyExtractor;
use crate::observe;
use crate::response::{Denied, DenyFn, refusal};
use crate::rule::valid_name;
use crate::rule::{Found, Lookup, OnMissingKey};
use crate::settings::{self, Settings};
use crate::{Decision, Key, RateLimitDecision, RuleDecision, Source};
use backend::{Acquire, Backend, Outcome, Permit};

type Headers = crate::headers::Rendered;

/// Limits how many requests per key are in flight at once.
///
/// Built with [`ConcurrencyLimitLayer::builder`]; cheap to clone, and every
/// service it makes shares the same counts. Combine it with a
/// [`RateLimitLayer`](crate::RateLimitLayer) to bound both the rate and the
/// parallelism of expensive endpoints.
///
/// ```
/// use std::time::Duration;
/// use keyed_rate_limit::{Key, concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
///     .retry_after(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(layer.max_in_flight(), 2);
/// assert_eq!(layer.in_flight(&Key::from("acct_1")), 0);
/// # Ok::<(), keyed_rate_limit::error::BuildError>(())
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct ConcurrencyLimitLayer {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    name: Arc<str>,
    key: KeyExtractor,
    limit: u32,
    on_missing: OnMissingKey,
    retry_after: Duration,
    max_key_len: usize,
    headers: crate::headers::Headers,
    deny: Arc<DenyFn>,
    backend: Backend,
    policy: Option<StaticPolicy>,
}

/// A found key with its slot or refusal.
enum Ready {
    Key(Key, Outcome),
    Missing,
    Skip,
}

/// Where [`Shared::decide`] stopped to await.
pub(crate) enum Stopped {
    /// The key extractor is async.
    Finding(BoxFuture<'static, Found>),
    /// The backend is.
    Taking(Key, BoxFuture<'static, Outcome>),
}

enum Taken {
    Ready(Ready),
    /// Redis is deciding.
    Pending(Key, BoxFuture<'static, Outcome>),
}

impl Taken {
    async fn resolve(self) -> Ready {
        match self {
            Self::Ready(r) => r,
            Self::Pending(key, fut) => Ready::Key(key, fut.await),
        }
    }
}

/// A request's slot: none when the limit does not apply to it.
type Admission = crate::gate::Admission<Option<Permit>>;

impl Shared {
    /// Finds the key and takes a slot without awaiting when it can (a
    /// sync key extractor and the local backend), else returns where it
    /// stopped for [`suspend`](Self::suspend).
    pub(crate) fn decide(&self, parts: &mut Parts) -> Result<Admission, Stopped> {
        let found = match self.on_missing.lookup(&self.key, parts) {
            Lookup::Now(found) => found,
            Lookup::Later(find) => return Err(Stopped::Finding(find)),
        };
        match self.take(found) {
            Taken::Ready(t) => Ok(self.admit(parts, t)),
            Taken::Pending(key, fut) => Err(Stopped::Taking(key, fut)),
        }
    }

    /// The rest of [`decide`](Self::decide), awaited.
    pub(crate) fn suspend(
        self: &Arc<Self>,
        mut parts: Parts,
        stopped: Stopped,
    ) -> crate::gate::Pending<Option<Permit>> {
        let this = self.clone();
        Box::pin(async move {
            let taken = match stopped {
                Stopped::Finding(find) => this.take(find.await).resolve().await,
                Stopped::Taking(key, fut) => Taken::Pending(key, fut).resolve().await,
            };
            let admission = this.admit(&mut parts, taken);
            (parts, admission)
        })
    }

    fn take(&self, found: Found) -> Taken {
        let key = match found {
            Found::Key(k) => k,
            Found::Skip => return Taken::Ready(Ready::Skip),
            Found::Missing => return Taken::Ready(Ready::Missing),
        };
        let bounded = key.clone().bounded(self.max_key_len);
        match self
            .backend
            .acquire(&self.name, bounded, self.limit, self.retry_after)
        {
            Acquire::Now(outcome) => Taken::Ready(Ready::Key(key, outcome)),
            Acquire::Later(fut) => Taken::Pending(key, fut),
        }
    }

    /// Builds the admission from a slot or a refusal; an admitted request's
    /// decision joins the rate limiter's in the extensions.
    fn admit(&self, parts: &mut Parts, taken: Ready) -> Admission {
        let (key, outcome) = match taken {
            Ready::Key(key, outcome) => (key, outcome),
            Ready::Skip => return Admission::Go(Headers::new(), None),
            Ready::Missing => match self.on_missing {
                OnMissingKey::Reject(status) => {
                    let denied = Denied {
                        rule: self.name.clone(),
                        retry_after: None,
                        status,
                        hidden: false,
                    };
                    return Admission::Stop(refusal(
                        &*self.deny,
                        &denied,
                        &parts.headers,
                        Headers::new(),
                    ));
                }
                _ => return Admission::Go(Headers::new(), None),
            },
        };
        let mut headers = Headers::new();
        let source = outcome.source;
        match outcome.verdict {
            Ok((permit, held)) => {
                // When a slot frees is unknown: `t` is the hint a refusal gets.
                let decision = Decision::allowed(
                    self.limit,
                    self.retry_after,
                    self.limit.saturating_sub(held),
                    Duration::ZERO,
                )
                .with_next_unit(self.retry_after);
                let mut rule = self.rule_decision(decision, source);
                self.headers
                    .render(std::slice::from_mut(&mut rule), &mut headers);
                match parts.extensions.get_mut::<RateLimitDecision>() {
                    Some(d) => d.rules.push(rule),
                    None => {
                        parts.extensions.insert(RateLimitDecision {
                            rules: smallvec::smallvec![rule],
                        });
                    }
                }
                Admission::Go(headers, Some(permit))
            }
            Err(refused) => {
                let wait = refused.retry_after.max(Duration::from_millis(1));
                let decision = Decision::denied(self.limit, self.retry_after, wait, wait);
                observe::deny(
                    &self.name,
                    &key.fingerprint(),
                    decision.retry_after(),
                    false,
                );
                self.headers
                    .render(&mut [self.rule_decision(decision, source)], &mut headers);
                let denied = Denied {
                    rule: self.name.clone(),
                    retry_after: Some(wait),
                    status: StatusCode::TOO_MANY_REQUESTS,
                    hidden: false,
                };
                Admission::Stop(refusal(&*self.deny, &denied, &parts.headers, headers))
            }
        }
    }

    fn rule_decision(&self, decision: Decision, source: Source) -> RuleDecision {
        RuleDecision {
            rule: self.name.clone(),
            policy: StaticPolicy::for_decision(&self.policy, &decision),
            decision,
            source,
            shadow: false,
            concurrency: true,
            hidden: false,
            partition: None,
        }
    }
}

impl ConcurrencyLimitLayer {
    /// Starts a builder for a limit named `name` (it labels headers, logs and
    /// metrics) of `max_in_flight` requests per key found by `key`.
    ///
    /// ```
    /// use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let err = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 0).build();
    /// assert!(err.is_err(), "a limit of zero admits nothing");
    /// ```
    pub fn builder(
        name: impl Into<Arc<str>>,
        key: KeyExtractor,
        max_in_flight: u32,
    ) -> ConcurrencyLimitBuilder {
        ConcurrencyLimitBuilder {
            name: name.into(),
            key,
            limit: max_in_flight,
            on_missing: OnMissingKey::default(),
            retry_after: Duration::from_secs(1),
            settings: Settings::default(),
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            lease_ttl: Duration::from_secs(30),
            #[cfg(feature = "redis")]
            failure: FailurePolicy::default(),
        }
    }

    /// The limit's name.
    ///
    /// ```
    /// # use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 1).build().unwrap();
    /// assert_eq!(l.name(), "exports");
    /// ```
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The most requests one key may have in flight.
    ///
    /// ```
    /// # use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 3).build().unwrap();
    /// assert_eq!(l.max_in_flight(), 3);
    /// ```
    pub fn max_in_flight(&self) -> u32 {
        self.shared.limit
    }

    /// How many requests `key` has in flight now through this layer (for a
    /// global limit (feature `redis`), this instance's
    /// share of the total in Redis; keys longer than
    /// [`max_key_len`](ConcurrencyLimitBuilder::max_key_len) are looked up
    /// by their hash, as the layer stores them).
    ///
    /// ```
    /// # use keyed_rate_limit::{Key, concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 3).build().unwrap();
    /// assert_eq!(l.in_flight(&Key::from("*")), 0);
    /// ```
    pub fn in_flight(&self, key: &Key) -> u32 {
        let key = key.clone().bounded(self.shared.max_key_len);
        self.shared.backend.in_flight(&key)
    }

    /// How many keys this instance holds now (for a global limit too): only
    /// keys with a request in flight are kept, so this is a gauge for memory.
    ///
    /// ```
    /// # use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let l = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 3).build().unwrap();
    /// assert_eq!(l.local_keys(), 0);
    /// ```
    pub fn local_keys(&self) -> usize {
        self.shared.backend.keys()
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimitService::new(inner, self.shared.clone())
    }
}

impl std::fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.shared.name)
            .field("key", &self.shared.key)
            .field("max_in_flight", &self.shared.limit)
            .finish_non_exhaustive()
    }
}

/// Configures a [`ConcurrencyLimitLayer`]; [`build`](Self::build) checks everything.
///
/// ```
/// use std::time::Duration;
/// use http::StatusCode;
/// use keyed_rate_limit::{HeaderStyle, concurrency::ConcurrencyLimitLayer, key::KeyExtractor, rule::OnMissingKey};
///
/// let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
///     .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
///     .retry_after(Duration::from_secs(10))
///     .headers(HeaderStyle::Both)
///     .max_key_len(128)
///     .build()?;
/// # Ok::<(), keyed_rate_limit::error::BuildError>(())
/// ```
#[must_use]
#[derive(Debug)]
pub struct ConcurrencyLimitBuilder {
    name: Arc<str>,
    key: KeyExtractor,
    limit: u32,
    on_missing: OnMissingKey,
    retry_after: Duration,
    settings: Settings,
    #[cfg(feature = "redis")]
    redis: Option<RedisBackend>,
    #[cfg(feature = "redis")]
    lease_ttl: Duration,
    #[cfg(feature = "redis")]
    failure: FailurePolicy,
}

impl ConcurrencyLimitBuilder {
    settings::settings_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::global(), 2)"
    );

    #[cfg(feature = "redis")]
    settings::failure_setters!(
        "ConcurrencyLimitLayer::builder(\"exports\", KeyExtractor::global(), 2)"
    );

    /// Counts in-flight requests in a shared Redis, so all gateway
    /// instances together admit at most `max_in_flight` per key.
    ///
    /// Each admitted request holds a lease: a member of the sorted set
    /// `prefix:{<len>:name:key}:lease` whose score is its expiry on Redis's
    /// clock. The lease is released when the response body ends or is
    /// dropped, renewed every [`lease_ttl`](Self::lease_ttl)` / 3` while it
    /// lives (one task per limit renews every lease this instance holds,
    /// one Redis call per key), and expires on its own after the TTL if
    /// this gateway crashes.
    /// A refusal's `Retry-After` is [`retry_after`](Self::retry_after), or
    /// sooner when the earliest lease expires sooner.
    /// [`in_flight`](ConcurrencyLimitLayer::in_flight) then reports this
    /// instance's requests only.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use keyed_rate_limit::{failure::FailureMode, backend::redis::RedisBackend};
    /// use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = RedisBackend::builder("redis://127.0.0.1:6379").build().await?;
    /// let exports = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), 2)
    ///     .global(redis)
    ///     .lease_ttl(Duration::from_secs(10))
    ///     .on_redis_failure(FailureMode::FailClosed)
    ///     .build()?;
    /// # let _ = exports;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn global(mut self, redis: RedisBackend) -> Self {
        self.redis = Some(redis);
        self
    }

    /// How long a lease in Redis lasts without renewal (default 30 s, at
    /// least 10 ms): the longest a crashed gateway's requests keep their
    /// slots. Used by [`global`](Self::global) limits only.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use keyed_rate_limit::{concurrency::ConcurrencyLimitLayer, key::KeyExtractor};
    /// let b = ConcurrencyLimitLayer::builder("exports", KeyExtractor::global(), 2)
    ///     .lease_ttl(Duration::from_secs(5));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// What to do when the key extractor finds no key (default: the limit
    /// does not apply).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.on_missing = policy;
        self
    }

    /// The wait a refused client is told to observe before retrying
    /// (default 1 s): nobody knows when an in-flight request will end, so
    /// this is a hint, sent as `Retry-After` and `grpc-retry-pushback-ms`.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// Checks the configuration and builds the layer.
    ///
    /// # Errors
    ///
    /// An invalid name, a limit of zero, a zero `retry_after` or a
    /// `max_key_len` below 64; for a global limit also a name with braces,
    /// a zero `redis_timeout` or failure threshold, or a `lease_ttl` below
    /// 10 ms; see [`BuildError`].
    pub fn build(self) -> Result<ConcurrencyLimitLayer, BuildError> {
        if !valid_name(&self.name) {
            return Err(BuildError::InvalidRuleName(self.name.to_string()));
        }
        if self.limit == 0 {
            return Err(BuildError::InvalidSetting(
                "max_in_flight must be at least 1",
            ));
        }
        if self.retry_after.is_zero() {
            return Err(BuildError::InvalidSetting("retry_after must be positive"));
        }
        self.settings.validate()?;
        self.on_missing.check_keys(&self.key, &self.name)?;
        #[cfg(not(feature = "redis"))]
        let backend = Backend::local();
        #[cfg(feature = "redis")]
        let backend = match self.redis {
            None => Backend::local(),
            Some(redis) => {
                validate_global(&self.name, &self.failure, &redis, self.settings.instances)?;
                if self.lease_ttl < Duration::from_millis(10) {
                    return Err(BuildError::InvalidSetting(
                        "lease_ttl must be at least 10 ms",
                    ));
                }
                // The fallback is the local backend's own count, not the
                // guard's rate store.
                let live = redis.live_count();
                Backend::redis(
                    redis,
                    Guard::new(
                        self.name.clone(),
                        self.failure,
                        self.settings.instances(),
                        live,
                    ),
                    self.lease_ttl,
                )
            }
        };
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                // Rendered once, and only when `RateLimit-Policy` is sent.
                policy: self
                    .settings
                    .headers
                    .draft()
                    .then(|| StaticPolicy::new(&self.name, self.limit, self.retry_after, true))
                    .flatten(),
                name: self.name,
                key: self.key,
                limit: self.limit,
                on_missing: self.on_missing,
                retry_after: self.retry_after,
                max_key_len: self.settings.max_key_len,
                headers: self.settings.headers,
                deny: self.settings.deny,
                backend,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::Response;
    use http_body_util::Full;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn grpc_refusal_is_resource_exhausted_with_pushback() {
        let layer = ConcurrencyLimitLayer::builder("streams", KeyExtractor::global(), 1)
            .retry_after(Duration::from_millis(2500))
            .build()
            .unwrap();
        let mut svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::default()))
        }));
        let grpc = || {
            http::Request::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap()
        };
        // The first response's body is kept unread: it holds the slot.
        let held = svc.ready().await.unwrap().call(grpc()).await.unwrap();
        let res = svc.ready().await.unwrap().call(grpc()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "2500");
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(
            res.headers()["grpc-message"],
            "rate limit \"streams\" exceeded"
        );
        drop(held);
        assert_eq!(layer.in_flight(&Key::from("*")), 0);
    }

    #[test]
    fn build_checks_settings() {
        let b = || ConcurrencyLimitLayer::builder("x", KeyExtractor::global(), 1);
        assert!(matches!(
            ConcurrencyLimitLayer::builder("", KeyExtractor::global(), 1).build(),
            Err(BuildError::InvalidRuleName(_))
        ));
        assert!(b().retry_after(Duration::ZERO).build().is_err());
        assert!(b().max_key_len(8).build().is_err());
        assert!(b().build().is_ok());
    }
}
