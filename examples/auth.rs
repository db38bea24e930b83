//! Auth and rate limiting composed: per-tenant, plan-dependent quotas behind
//! an auth middleware, per-IP limits for anonymous traffic, and a per-IP
//! guard in front of auth itself.
//!
//! Run with `cargo run --example auth`, then:
//!
//! ```text
//! curl -i -H 'x-api-key: free-key' http://127.0.0.1:3000/whoami   # 5 per minute
//! curl -i -H 'x-api-key: pro-key'  http://127.0.0.1:3000/whoami   # 20 per minute
//! curl -i http://127.0.0.1:3000/whoami                            # 3 per minute per IP
//! ```
//!
//! # Layer order
//!
//! In axum the last `.layer` is the outermost: it sees the request first.
//!
//! * **Auth outside the limiter** (`.layer(limiter).layer(auth)`): auth runs
//!   first and puts the [`Tenant`] in the request extensions, so the limiter
//!   can key on the tenant ([`KeyExtractor::extension`]) and pick the
//!   quota by plan ([`Rule::computed`]). Requests auth turns away never
//!   reach the limiter, so they cost no quota, and nothing limits them.
//! * **Limiter outside auth** (`.layer(auth).layer(limiter)`): the limiter
//!   runs first and sees only what the request carries — the peer IP, raw
//!   headers — not who the caller is. That is the place to protect auth
//!   itself: a per-IP guard bounds how many keys one client can try (brute
//!   force) and how much work key lookups cost, before any lookup happens.
//!
//! This app uses both: `ip-guard` outside auth, `api` inside it.

use std::net::SocketAddr;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use keyed_rate_limit::BuildError;
use keyed_rate_limit::KeyExtractor;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{Key, Quota, RateLimitLayer, Rule};

/// A customer's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// 5 requests per minute.
    Free,
    /// 20 requests per minute.
    Pro,
}

impl Plan {
    /// The plan's quota.
    pub const fn quota(self) -> Quota {
        match self {
            Plan::Free => Quota::per_minute(5),
            Plan::Pro => Quota::per_minute(20),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Pro => "pro",
        }
    }
}

/// Requests without an API key, per client IP.
pub const ANONYMOUS: Quota = Quota::per_minute(3);

/// Every request, keyed or not, valid or not, per client IP: bounds API key
/// guessing.
pub const GUARD: Quota = Quota::per_minute(60);

/// Who an API key belongs to, as auth puts it in the request extensions.
#[derive(Clone, Debug)]
pub struct Tenant {
    /// The tenant's id.
    pub id: &'static str,
    /// The tenant's plan.
    pub plan: Plan,
}

/// Stands in for a key store.
fn lookup(api_key: &[u8]) -> Option<Tenant> {
    match api_key {
        b"free-key" => Some(Tenant {
            id: "acme",
            plan: Plan::Free,
        }),
        b"pro-key" => Some(Tenant {
            id: "globex",
            plan: Plan::Pro,
        }),
        _ => None,
    }
}

/// Resolves `x-api-key` to a [`Tenant`]; no key is anonymous, a wrong key is 401.
async fn auth(mut req: Request, next: Next) -> Response {
    let Some(api_key) = req.headers().get("x-api-key") else {
        return next.run(req).await;
    };
    match lookup(api_key.as_bytes()) {
        Some(tenant) => {
            req.extensions_mut().insert(tenant);
            next.run(req).await
        }
        None => (StatusCode::UNAUTHORIZED, "unknown API key").into_response(),
    }
}

async fn whoami(tenant: Option<Extension<Tenant>>) -> String {
    match tenant {
        Some(Extension(t)) => format!("{} ({})", t.id, t.plan.as_str()),
        None => "anonymous".to_owned(),
    }
}

/// The app: `ip-guard` (per IP) → auth → `api` (per tenant by plan, or per
/// IP when anonymous) → handler. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()` so the limiter
/// sees the peer IP.
pub fn app() -> Result<Router, BuildError> {
    let guard = RateLimitLayer::builder()
        .rule(Rule::new("ip-guard", KeyExtractor::peer_ip(), GUARD))
        .build()?;
    // Anonymous requests fall back to the peer IP. Each distinct quota keeps
    // its own counters, and tenant keys are prefixed, so IPs and tenants
    // never share a budget.
    let per_tenant = RateLimitLayer::builder()
        .rule(
            Rule::computed(
                "api",
                KeyExtractor::extension::<Tenant>(|t| Key::from(format!("tenant:{}", t.id))),
                |parts| match parts.extensions.get::<Tenant>() {
                    Some(t) => t.plan.quota(),
                    None => ANONYMOUS,
                },
            )
            .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip())),
        )
        .build()?;
    Ok(Router::new()
        .route("/whoami", get(whoami))
        .layer(per_tenant)
        .layer(middleware::from_fn(auth))
        .layer(guard))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate's diagnostics are `tracing` events: INFO and up unless
    // RUST_LOG says otherwise (`fmt::init()` would show only errors once
    // tracing-subscriber's `env-filter` feature is on anywhere in the build).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = app()?.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await?;
    Ok(())
}
