use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, MatchedPath};
use futures_util::future::BoxFuture;
use http::header::HeaderName;
use http::request::Parts;

use super::Key;
use super::forwarded::TrustedProxies;
use super::source::{KeySource, Misconfig};
use crate::util::now_or_later::NowOrLater;
use crate::util::throttle::Throttle;

type SyncFn = dyn Fn(&Parts) -> Option<Key> + Send + Sync;
type AsyncFn = dyn Fn(&Parts) -> BoxFuture<'static, Option<Key>> + Send + Sync;
/// The client IP an IP extractor keys by, for [`Rule::exempt_ips`](crate::Rule::exempt_ips).
pub(crate) type IpFn = dyn Fn(&Parts) -> Option<IpAddr> + Send + Sync;

#[derive(Clone)]
enum Kind {
    Sync(Arc<SyncFn>),
    Async(Arc<AsyncFn>),
}

/// Finds the [`Key`] a request counts against, or `None` when it carries no
/// such identity (the rule's [`OnMissingKey`](crate::key::OnMissingKey) then decides).
///
/// Extractors see the request head ([`Parts`]), so they work for any body type
/// and can read extensions set by earlier layers (auth, `ConnectInfo`).
/// The `name` is a short label for docs and logs, e.g. `header:x-api-key`.
///
/// ```
/// use keyed_rate_limit::KeyExtractor;
///
/// // A sync closure:
/// let by_tenant = KeyExtractor::new("tenant", |parts| {
///     parts.headers.get("x-tenant").map(|v| v.as_bytes().to_vec().into())
/// });
/// // Built-ins, combined: the API key, else the peer IP.
/// let by_key_or_ip = KeyExtractor::header("x-api-key").or(KeyExtractor::peer_ip());
/// assert_eq!(by_key_or_ip.name(), "header:x-api-key|peer_ip");
/// ```
#[derive(Clone)]
pub struct KeyExtractor {
    kind: Kind,
    name: Arc<str>,
    /// What the key is read from, to tell a missing key from a setup in
    /// which no request can have one.
    source: KeySource,
    /// A configuration error, reported by the builder that gets this
    /// extractor instead of a panic where it is written.
    invalid: Option<Arc<str>>,
    /// How the IP extractors find the client's address, unprefixed and
    /// without their warnings: what `exempt_ips` checks, so it trusts
    /// exactly the proxies the key does.
    ip: Option<Arc<IpFn>>,
}

/// The result of running an extractor: most are ready at once, so the
/// layer only allocates a future when an async extractor needs one.
pub(crate) type Extracted = NowOrLater<Option<Key>>;

impl KeyExtractor {
    /// A key from a sync closure over the request head.
    ///
    /// ```
    /// use keyed_rate_limit::{Key, KeyExtractor};
    /// let by_method = KeyExtractor::new("method", |p| Some(Key::from(p.method.to_string())));
    /// assert_eq!(by_method.name(), "method");
    /// ```
    pub fn new<F>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Key> + Send + Sync + 'static,
    {
        Self::of(Kind::Sync(Arc::new(f)), name.into())
    }

    /// A key from an async closure. The closure reads what it needs from the
    /// head synchronously (e.g. clones a session from the extensions) and
    /// returns a `'static` future that may await a lookup.
    ///
    /// ```
    /// use keyed_rate_limit::{Key, KeyExtractor};
    ///
    /// #[derive(Clone)]
    /// struct Session { account: u64 }
    ///
    /// let by_account = KeyExtractor::new_async("account", |parts| {
    ///     let session = parts.extensions.get::<Session>().cloned();
    ///     async move { session.map(|s| Key::from(s.account)) }
    /// });
    /// assert_eq!(by_account.name(), "account");
    /// ```
    pub fn new_async<F, Fut>(name: impl Into<Arc<str>>, f: F) -> Self
    where
        F: Fn(&Parts) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Key>> + Send + 'static,
    {
        Self::of(Kind::Async(Arc::new(move |p| Box::pin(f(p)))), name.into())
    }

    /// An extractor of any source, valid, with no IP of its own.
    fn of(kind: Kind, name: Arc<str>) -> Self {
        Self {
            kind,
            name,
            source: KeySource::Any,
            invalid: None,
            ip: None,
        }
    }

    /// The value of a request header, e.g. an API key. Absent or empty
    /// headers give no key; non-UTF-8 values are used as raw bytes.
    ///
    /// An invalid header name (case does not matter) is a
    /// [`BuildError::InvalidKey`](crate::error::BuildError::InvalidKey) from
    /// the builder the extractor is given to, never a panic.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
    /// let k = KeyExtractor::header("x-api-key");
    /// assert_eq!(k.name(), "header:x-api-key");
    ///
    /// let bad = Rule::new("r", KeyExtractor::header("x api key"), Quota::per_minute(1));
    /// assert!(RateLimitLayer::builder().rule(bad).build().is_err());
    /// ```
    pub fn header(name: &str) -> Self {
        let Ok(header) = HeaderName::from_bytes(name.as_bytes()) else {
            let mut never = Self::new(format!("header:{name}"), |_| None);
            never.invalid = Some(format!("invalid header name {name:?}").into());
            return never;
        };
        Self::new(format!("header:{header}"), move |p| {
            p.headers
                .get(&header)
                .map(|v| v.as_bytes())
                .filter(|v| !v.is_empty())
                .map(Key::copy_from_slice)
        })
    }

    /// The configuration error this extractor, or one it combines, carries.
    pub(crate) fn validate(&self, rule: &str) -> Result<(), crate::error::BuildError> {
        match &self.invalid {
            None => Ok(()),
            Some(error) => Err(crate::error::BuildError::InvalidKey {
                rule: rule.to_owned(),
                error: error.to_string(),
            }),
        }
    }

    /// A key from a value an earlier layer put in the request extensions,
    /// typically the authenticated user or tenant, that every request must
    /// carry. `f` may be any closure.
    ///
    /// Add the rate limit *inside* the layer that inserts `T`, so that it
    /// runs after it: later in a `ServiceBuilder`, but **earlier** in axum's
    /// `.layer` calls (the one written last runs first):
    /// `Router::new().route(..).layer(rate_limit).layer(auth)`.
    ///
    /// With no [`OnMissingKey`](crate::key::OnMissingKey) set, a request
    /// without `T` is refused with 500 and logged at ERROR: either the layers
    /// are in the wrong order, and no request would ever be limited, or the
    /// request is anonymous. When anonymous requests are expected, say so:
    /// [`optional_extension`](Self::optional_extension) skips them, and
    /// `OnMissingKey::Reject` (401) or `Fallback` (by IP) do what their names
    /// say.
    ///
    /// ```
    /// use keyed_rate_limit::{Key, KeyExtractor};
    ///
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    ///
    /// let by_user = KeyExtractor::extension::<User>(|u| Key::from(u.id));
    /// assert_eq!(by_user.name(), "extension");
    /// ```
    pub fn extension<T>(f: impl Fn(&T) -> Key + Send + Sync + 'static) -> Self
    where
        T: Send + Sync + 'static,
    {
        let has = |p: &Parts| p.extensions.get::<T>().is_some();
        Self {
            source: KeySource::Extension(has, std::any::type_name::<T>()),
            ..Self::new("extension", move |p| p.extensions.get::<T>().map(&f))
        }
    }

    /// A key from a value an earlier layer *may* put in the request
    /// extensions: auth that lets anonymous requests through. A request
    /// without `T` has no key, and the rule's
    /// [`OnMissingKey`](crate::key::OnMissingKey) decides; with none set,
    /// the rule skips it (anonymous requests are not limited by it).
    ///
    /// The layer order matters as for [`extension`](Self::extension). In
    /// the wrong order no request has `T`, so the rule limits nothing; it
    /// then logs a warning once a minute ("found no key in any request").
    ///
    /// ```
    /// use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer, Rule};
    ///
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    ///
    /// // Known users get 100 a minute each; anonymous requests pass.
    /// let per_user = Rule::new(
    ///     "per-user",
    ///     KeyExtractor::optional_extension::<User>(|u| Key::from(u.id)),
    ///     Quota::per_minute(100),
    /// );
    /// let limit = RateLimitLayer::builder().rule(per_user).build().unwrap();
    /// // axum: `Router::new().route(..).layer(limit).layer(auth)`.
    /// # let _ = limit;
    /// ```
    pub fn optional_extension<T>(f: impl Fn(&T) -> Key + Send + Sync + 'static) -> Self
    where
        T: Send + Sync + 'static,
    {
        Self {
            source: KeySource::OptionalExtension,
            ..Self::new("optional_extension", move |p| {
                p.extensions.get::<T>().map(&f)
            })
        }
    }

    /// The TCP peer's IP, from axum's `ConnectInfo<SocketAddr>` or, with
    /// feature `tonic`, tonic's `TcpConnectInfo`.
    ///
    /// axum only records the peer when told to: serve with
    /// `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`.
    /// Without it no request has a peer address, so a rule keyed on it
    /// refuses every request with 500 and logs the fix (whatever its
    /// [`OnMissingKey`](crate::key::OnMissingKey), it logs), rather than
    /// limit nothing. IPv6 peers are keyed by
    /// their /56 network ([`DEFAULT_V6_PREFIX`](super::DEFAULT_V6_PREFIX):
    /// one ISP delegation; see [`peer_ip_prefix`](Self::peer_ip_prefix)),
    /// IPv4-mapped and IPv4-compatible IPv6 addresses as IPv4.
    ///
    /// Behind a reverse proxy every request comes from the proxy, so all
    /// clients would share one key: use [`client_ip`](Self::client_ip). A
    /// request that carries `X-Forwarded-For` or `Forwarded` from a private
    /// or loopback peer is logged as a likely misconfiguration (at most once
    /// a minute per extractor) and counted in
    /// [`PROXY_MISCONFIG_TOTAL`](crate::observe::PROXY_MISCONFIG_TOTAL).
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    /// use keyed_rate_limit::KeyExtractor;
    ///
    /// let k = KeyExtractor::peer_ip();
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(ConnectInfo("192.0.2.7:5000".parse::<SocketAddr>().unwrap()));
    /// # let (parts, _) = req.into_parts();
    /// # assert_eq!(k.extract_now(&parts).unwrap().as_bytes(), b"192.0.2.7");
    /// ```
    pub fn peer_ip() -> Self {
        Self::peer_ip_prefix(super::DEFAULT_V6_PREFIX)
    }

    /// [`peer_ip`](Self::peer_ip), IPv6 peers keyed by their `/v6_prefix`
    /// network: 64 for one LAN, 128 for single addresses (which lets an
    /// attacker with a /64 mint 2^64 keys). A length outside 1..=128 is a
    /// build error.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use axum::extract::ConnectInfo;
    /// use keyed_rate_limit::KeyExtractor;
    ///
    /// let k = KeyExtractor::peer_ip_prefix(64);
    /// let mut req = http::Request::new(());
    /// req.extensions_mut().insert(ConnectInfo("[2001:db8:1:2:3::9]:5000".parse::<SocketAddr>().unwrap()));
    /// let (parts, _) = req.into_parts();
    /// assert_eq!(k.extract_now(&parts).unwrap().as_bytes(), b"2001:db8:1:2::/64");
    /// ```
    pub fn peer_ip_prefix(v6_prefix: u8) -> Self {
        let resolve = |p: &Parts| Some(super::canonical(peer_addr(p)?.ip()));
        Self::ip("peer_ip", v6_prefix, move |p, warn| {
            let ip = peer_addr(p)?.ip();
            if forwarded(p) && is_private(ip) {
                crate::observe::proxy_misconfig(
                    "peer_ip_behind_proxy",
                    "peer_ip() sees X-Forwarded-For/Forwarded from a private or loopback peer: \
                     a proxy is in front and every client shares its key; use client_ip()",
                    warn.ready(WARN_EVERY),
                );
            }
            Some(ip)
        })
        .resolving(resolve)
    }

    /// With `resolve` as the client IP `exempt_ips` checks.
    fn resolving(
        mut self,
        resolve: impl Fn(&Parts) -> Option<IpAddr> + Send + Sync + 'static,
    ) -> Self {
        self.ip = Some(Arc::new(resolve));
        self
    }

    /// An IP extractor named `base` (`base/<len>` off the default prefix)
    /// keying what `find` returns by its `/v6_prefix` network; an invalid
    /// length is the builder's error.
    fn ip<F>(base: &str, v6_prefix: u8, find: F) -> Self
    where
        F: Fn(&Parts, &Throttle) -> Option<IpAddr> + Send + Sync + 'static,
    {
        let warn = Throttle::default();
        let name = if v6_prefix == super::DEFAULT_V6_PREFIX {
            base.to_owned()
        } else {
            format!("{base}/{v6_prefix}")
        };
        let mut k = Self::new(name, move |p| {
            find(p, &warn).map(|ip| super::ip::ip_key(ip, v6_prefix))
        });
        k.source = KeySource::ConnectInfo;
        k.invalid = (!super::ip::valid_v6_prefix(v6_prefix))
            .then(|| format!("IPv6 prefix /{v6_prefix} is not in 1..=128").into());
        k
    }

    /// The client IP as seen through trusted reverse proxies. See
    /// [`TrustedProxies`] for how the forwarding header is walked.
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, key::TrustedProxies};
    /// let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    /// let k = KeyExtractor::client_ip(proxies);
    /// assert_eq!(k.name(), "client_ip");
    /// ```
    pub fn client_ip(proxies: TrustedProxies) -> Self {
        Self::client_ip_prefix(proxies, super::DEFAULT_V6_PREFIX)
    }

    /// [`client_ip`](Self::client_ip), IPv6 clients keyed by their
    /// `/v6_prefix` network (see [`peer_ip_prefix`](Self::peer_ip_prefix)).
    ///
    /// ```
    /// use keyed_rate_limit::{KeyExtractor, key::TrustedProxies};
    /// let k = KeyExtractor::client_ip_prefix(TrustedProxies::new(["10.0.0.0/8"]).unwrap(), 64);
    /// assert_eq!(k.name(), "client_ip/64");
    /// ```
    pub fn client_ip_prefix(proxies: TrustedProxies, v6_prefix: u8) -> Self {
        let trusted = proxies.clone();
        let resolve = move |p: &Parts| Some(trusted.client_ip(peer_addr(p)?.ip(), &p.headers));
        Self::ip("client_ip", v6_prefix, move |p, warn| {
            let peer = peer_addr(p)?.ip();
            // A private peer is one's own infrastructure; public clients
            // behind corporate proxies send the header all the time.
            if forwarded(p) && is_private(peer) && !proxies.is_trusted(super::canonical(peer)) {
                crate::observe::proxy_misconfig(
                    "untrusted_forwarder",
                    "client_ip() sees X-Forwarded-For/Forwarded from a private peer outside \
                     TrustedProxies: the header is ignored; add the proxy to TrustedProxies",
                    warn.ready(WARN_EVERY),
                );
            }
            Some(proxies.client_ip(peer, &p.headers))
        })
        .resolving(resolve)
    }

    /// The route pattern axum matched (`/users/{id}`, not `/users/7`), so
    /// each endpoint gets its own budget.
    ///
    /// Add the layer with `Router::route_layer` (or `Router::layer`): around
    /// the router, no route is matched yet, and the rule refuses every
    /// request with 500 and logs why. A request no route matches (the
    /// fallback) has no key; the rule's
    /// [`OnMissingKey`](crate::key::OnMissingKey) decides, skipping it by
    /// default.
    ///
    /// ```
    /// use keyed_rate_limit::KeyExtractor;
    /// // Per route and client: combine with `and`.
    /// let k = KeyExtractor::matched_route().and(KeyExtractor::peer_ip());
    /// assert_eq!(k.name(), "matched_route+peer_ip");
    /// ```
    pub fn matched_route() -> Self {
        Self {
            source: KeySource::Router,
            ..Self::new("matched_route", |p| {
                p.extensions
                    .get::<MatchedPath>()
                    .map(|m| Key::copy_from_slice(m.as_str().as_bytes()))
            })
        }
    }

    /// The same key for every request: one budget shared by all clients.
    ///
    /// ```
    /// use keyed_rate_limit::KeyExtractor;
    /// assert_eq!(KeyExtractor::everyone().name(), "everyone");
    /// ```
    pub fn everyone() -> Self {
        Self::new("everyone", |_| Some(Key::from("*")))
    }

    /// Both keys, joined: e.g. per route *and* per client. No key when either is missing.
    ///
    /// ```
    /// use keyed_rate_limit::KeyExtractor;
    /// let k = KeyExtractor::header("x-a").and(KeyExtractor::header("x-b"));
    /// let req = http::Request::builder().header("x-a", "1").header("x-b", "2").body(()).unwrap();
    /// # let (parts, _) = req.into_parts();
    /// assert_eq!(k.extract_now(&parts).unwrap().as_bytes(), b"1\x1f2");
    /// ```
    pub fn and(self, other: KeyExtractor) -> Self {
        let name = format!("{}+{}", self.name, other.name);
        self.combine(other, name, |a, b| {
            let (a, b) = (a?, b?);
            let mut joined = Vec::with_capacity(a.len() + b.len() + 1);
            joined.extend_from_slice(a.as_bytes());
            joined.push(0x1f); // ASCII unit separator: keeps ("a","bc") apart from ("ab","c")
            joined.extend_from_slice(b.as_bytes());
            Some(Key::from(joined))
        })
    }

    /// This key, or `other` when this one is missing: e.g. the API key, else the client IP.
    ///
    /// ```
    /// use keyed_rate_limit::KeyExtractor;
    /// let k = KeyExtractor::header("x-api-key").or(KeyExtractor::everyone());
    /// let (parts, _) = http::Request::new(()).into_parts();
    /// assert_eq!(k.extract_now(&parts).unwrap().as_bytes(), b"*");
    /// ```
    pub fn or(self, other: KeyExtractor) -> Self {
        let name = format!("{}|{}", self.name, other.name);
        match (&self.kind, &other.kind) {
            // Sync: don't even run `other` when this key exists.
            (Kind::Sync(a), Kind::Sync(b)) => {
                let (a, b) = (a.clone(), b.clone());
                Self {
                    invalid: self.invalid.or(other.invalid),
                    ip: self.ip.or(other.ip),
                    source: KeySource::both(self.source, other.source),
                    ..Self::new(name, move |p| a(p).or_else(|| b(p)))
                }
            }
            _ => self.combine(other, name, |a, b| a.or(b)),
        }
    }

    fn combine(
        self,
        other: KeyExtractor,
        name: String,
        join: fn(Option<Key>, Option<Key>) -> Option<Key>,
    ) -> Self {
        let invalid = self.invalid.or(other.invalid);
        let ip = self.ip.clone().or_else(|| other.ip.clone());
        let source = KeySource::both(self.source.clone(), other.source.clone());
        let combined = match (self.kind, other.kind) {
            (Kind::Sync(a), Kind::Sync(b)) => Self::new(name, move |p| join(a(p), b(p))),
            (a, b) => {
                let (a, b) = (
                    Self {
                        source: self.source,
                        ..Self::of(a, self.name)
                    },
                    Self {
                        source: other.source,
                        ..Self::of(b, other.name)
                    },
                );
                Self::new_async(name, move |p| {
                    let (fa, fb) = (a.extract(p), b.extract(p));
                    async move { join(fa.resolve().await, fb.resolve().await) }
                })
            }
        };
        Self {
            invalid,
            source,
            ip,
            ..combined
        }
    }

    /// The client IP as this extractor resolves it (the first IP extractor
    /// it combines), else the TCP peer's: what `exempt_ips` checks.
    pub(crate) fn client_addr(&self, parts: &Parts) -> Option<IpAddr> {
        match &self.ip {
            Some(resolve) => resolve(parts),
            None => peer_addr(parts).map(|a| super::canonical(a.ip())),
        }
    }

    /// The source this request lacks, so that no key could be found: asked
    /// only once the extractor found none.
    pub(crate) fn absent(&self, parts: &Parts) -> Option<Misconfig> {
        self.source.absent(parts)
    }

    /// The source it reads, for `describe()`.
    pub(crate) fn needs(&self) -> Option<String> {
        self.source.needs()
    }

    /// Whether another layer (authentication) sets what this reads: a
    /// request extension. A rule placed before that layer never finds it.
    pub(crate) fn set_by_a_layer(&self) -> bool {
        self.source.reads_an_extension()
    }

    /// The label given at construction.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this extractor returns its key without awaiting.
    pub fn is_sync(&self) -> bool {
        matches!(self.kind, Kind::Sync(_))
    }

    /// Runs a sync extractor on a request head at once, as the layer runs
    /// it: to test an extractor of your own without a server. The layer
    /// then counts a key longer than its `max_key_len` under
    /// [`Key::bounded`]. `None` when it finds no key, and for an async
    /// extractor (whose key only the layer awaits).
    ///
    /// ```
    /// use keyed_rate_limit::KeyExtractor;
    /// let k = KeyExtractor::header("x-api-key");
    /// let (parts, _) = http::Request::get("/").header("x-api-key", "k1").body(()).unwrap().into_parts();
    /// assert_eq!(k.extract_now(&parts).unwrap().as_bytes(), b"k1");
    /// ```
    pub fn extract_now(&self, parts: &Parts) -> Option<Key> {
        match &self.kind {
            Kind::Sync(f) => f(parts),
            Kind::Async(_) => None,
        }
    }

    pub(crate) fn extract(&self, parts: &Parts) -> Extracted {
        match &self.kind {
            Kind::Sync(f) => Extracted::Now(f(parts)),
            Kind::Async(f) => Extracted::Later(f(parts)),
        }
    }
}

impl fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyExtractor")
            .field("name", &self.name)
            .finish()
    }
}

/// Whether the request carries a forwarding header.
fn forwarded(p: &Parts) -> bool {
    p.headers.contains_key("x-forwarded-for") || p.headers.contains_key(http::header::FORWARDED)
}

/// At most one misconfiguration warning a minute from one extractor: it
/// repeats on every request, and a log line per request would drown it.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// A peer that is most likely a proxy of one's own: private, loopback,
/// link-local or unique-local.
fn is_private(ip: IpAddr) -> bool {
    match super::canonical(ip) {
        IpAddr::V4(v4) => v4.is_private() || v4.is_loopback() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unique_local() || v6.is_unicast_link_local(),
    }
}

/// axum's `ConnectInfo`, or with feature `tonic` tonic's `TcpConnectInfo`.
fn peer_addr(p: &Parts) -> Option<SocketAddr> {
    if let Some(ConnectInfo(addr)) = p.extensions.get::<ConnectInfo<SocketAddr>>() {
        return Some(*addr);
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = p
        .extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|c| c.remote_addr())
    {
        return Some(addr);
    }
    None
}
