//! Where a built-in extractor finds its key, and how to tell a request
//! without a key from a layer that is set up so that no request can have
//! one.

use std::fmt;
use std::sync::Arc;

use axum::extract::{ConnectInfo, MatchedPath, OriginalUri};
use http::request::Parts;

/// Why a key's source is missing from a request: the service is set up so
/// that no request can carry the key, which is a mistake in the setup, not
/// in the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Misconfig {
    /// No `ConnectInfo<SocketAddr>` (nor tonic's `TcpConnectInfo`).
    NoConnectInfo,
    /// Neither `MatchedPath` nor `OriginalUri`: no axum router has seen the
    /// request, so the layer wraps the router instead of sitting in it.
    OutsideRouter,
    /// No extension of this type: the layer runs before the one that
    /// inserts it, or the request is anonymous.
    NoExtension(&'static str),
}

impl Misconfig {
    /// The `kind` label of `rate_limit_misconfig_total`.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::NoConnectInfo => "no_connect_info",
            Self::OutsideRouter => "outside_router",
            Self::NoExtension(_) => "no_extension",
        }
    }

    /// Whether no request could ever lack this source in a correct setup:
    /// an explicit `OnMissingKey` does not make it right, so it is logged
    /// anyway. An extension may be missing for anonymous requests.
    pub(crate) fn always_wrong(self) -> bool {
        !matches!(self, Self::NoExtension(_))
    }

    /// What to change, for the log line.
    pub(crate) fn fix(self) -> &'static str {
        match self {
            Self::NoConnectInfo => {
                "serve with `app.into_make_service_with_connect_info::<SocketAddr>()` \
                 (a wrapped router: `ServiceExt::<Request>::into_make_service_with_connect_info`)"
            }
            Self::OutsideRouter => {
                "add the layer with `Router::route_layer` or `Router::layer`, not around the router"
            }
            Self::NoExtension(_) => {
                "either the rate limit runs before the layer that inserts the extension (in axum \
                 the `.layer` call written last runs first: write `.layer(rate_limit)` above \
                 `.layer(auth)`), or the request is anonymous: if requests without it are \
                 expected, key with `KeyExtractor::optional_extension` (anonymous requests skip \
                 the rule) or set `OnMissingKey::Skip`, `Reject` or `Fallback`"
            }
        }
    }

    /// What a client is told: the setup in words, never a Rust type (the
    /// log line has those).
    pub(crate) fn public(self) -> &'static str {
        match self {
            Self::NoConnectInfo => "the server does not record client addresses",
            Self::OutsideRouter => "the rate limit runs outside the router",
            Self::NoExtension(_) => {
                "the request lacks what the rate limit counts it by, which an earlier layer \
                 (such as authentication) should have set"
            }
        }
    }
}

impl fmt::Display for Misconfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoConnectInfo => f.write_str("the request has no ConnectInfo<SocketAddr>"),
            Self::OutsideRouter => f.write_str("no axum router has seen the request"),
            Self::NoExtension(t) => write!(f, "the request has no {t} extension"),
        }
    }
}

/// Which source a built-in extractor reads; `Any` for closures, whose
/// sources the crate cannot see.
#[derive(Clone, Debug)]
pub(crate) enum KeySource {
    Any,
    ConnectInfo,
    Router,
    Extension(fn(&Parts) -> bool, &'static str),
    /// An extension whose absence is expected (`optional_extension`): never
    /// a missing source, but still set by another layer.
    OptionalExtension,
    /// Either extractor's source, for `and` and `or`.
    Both(Arc<(KeySource, KeySource)>),
}

impl KeySource {
    /// Whether it reads a request extension (itself or through `and`/`or`).
    pub(crate) fn reads_an_extension(&self) -> bool {
        match self {
            Self::Extension(..) | Self::OptionalExtension => true,
            Self::Both(both) => both.0.reads_an_extension() || both.1.reads_an_extension(),
            _ => false,
        }
    }

    /// The missing source, if this request lacks it. Asked only once the
    /// extractor has found no key.
    pub(crate) fn absent(&self, p: &Parts) -> Option<Misconfig> {
        match self {
            Self::Any | Self::OptionalExtension => None,
            Self::ConnectInfo => (!has_connect_info(p)).then_some(Misconfig::NoConnectInfo),
            // An unmatched request (a fallback, a 404) has no MatchedPath
            // either, but the router gave it its OriginalUri.
            Self::Router => (p.extensions.get::<MatchedPath>().is_none()
                && p.extensions.get::<OriginalUri>().is_none())
            .then_some(Misconfig::OutsideRouter),
            Self::Extension(has, name) => (!has(p)).then_some(Misconfig::NoExtension(name)),
            Self::Both(ab) => ab.0.absent(p).or_else(|| ab.1.absent(p)),
        }
    }

    /// What the source is, for `describe()`: `ConnectInfo`, `an axum
    /// router`, `the User extension`; `None` for closures.
    pub(crate) fn needs(&self) -> Option<String> {
        match self {
            Self::Any | Self::OptionalExtension => None,
            Self::ConnectInfo => Some("ConnectInfo".to_owned()),
            Self::Router => Some("an axum router".to_owned()),
            Self::Extension(_, t) => Some(format!("the {} extension", short_type(t))),
            Self::Both(ab) => match (ab.0.needs(), ab.1.needs()) {
                (Some(a), Some(b)) if a == b => Some(a),
                (Some(a), Some(b)) => Some(format!("{a} or {b}")),
                (a, b) => a.or(b),
            },
        }
    }

    /// `a` and `b` together.
    pub(crate) fn both(a: Self, b: Self) -> Self {
        match (a, b) {
            (Self::Any, s) | (s, Self::Any) => s,
            (a, b) => Self::Both(Arc::new((a, b))),
        }
    }
}

fn has_connect_info(p: &Parts) -> bool {
    if p.extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .is_some()
    {
        return true;
    }
    #[cfg(feature = "tonic")]
    if p.extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .is_some()
    {
        return true;
    }
    false
}

/// `app::auth::User` as `User`; generics kept whole.
fn short_type(t: &str) -> &str {
    match t.find('<') {
        Some(_) => t,
        None => t.rsplit("::").next().unwrap_or(t),
    }
}
