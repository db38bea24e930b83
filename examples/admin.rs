//! A login limit that counts failures only, locks brute force out, forgives
//! a successful login, and an admin API over the layer's control handle.
//!
//! Run with `cargo run --example admin`, then:
//!
//! ```text
//! curl -i -H 'x-user: alice' -H 'x-pass: wrong' http://127.0.0.1:3000/login   # 401, counted
//! curl -i -H 'x-user: alice' -H 'x-pass: secret' http://127.0.0.1:3000/login  # 200, resets alice
//! curl -i -H 'x-admin-token: admin-token' http://127.0.0.1:3000/admin/limits/login/alice
//! curl -i -X POST -H 'x-admin-token: admin-token' 'http://127.0.0.1:3000/admin/limits/login/alice/block?secs=60'
//! curl -i -X POST -H 'x-admin-token: admin-token' http://127.0.0.1:3000/admin/limits/login/alice/reset
//! ```
//!
//! The admin routes sit behind their own auth middleware, in the pattern of
//! `examples/auth.rs`: a request without the admin token never reaches the
//! handle. The limiter wraps `/login` only.

use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderMap, StatusCode};
use keyed_rate_limit::KeyExtractor;
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{BuildError, rate_limit::ControlError};
use keyed_rate_limit::{Quota, RateLimitLayer, Rule, decision::Decision, rate_limit::Control};

/// Failed logins a user may make per 15 minutes.
pub const FAILURES: u32 = 5;
/// How long a user who keeps failing is locked out.
pub const LOCKOUT: Duration = Duration::from_secs(15 * 60);
/// Stands in for a secret the operators hold.
pub const ADMIN_TOKEN: &str = "admin-token";

/// Stands in for a password check.
fn password_ok(user: &str, pass: &str) -> bool {
    user == "alice" && pass == "secret"
}

/// 401s count toward `FAILURES` per 15 minutes; once spent, five more
/// refused attempts within 15 minutes lock the user out for `LOCKOUT`.
pub fn login_rule() -> Rule {
    let window = Duration::from_secs(15 * 60);
    Rule::new(
        "login",
        KeyExtractor::header("x-user"),
        Quota::new(FAILURES, window),
    )
    .count_if(|res| res.status == StatusCode::UNAUTHORIZED)
    .lockout(Lockout::new(5, window, LOCKOUT))
}

async fn login(State(control): State<Control>, headers: HeaderMap) -> StatusCode {
    let field = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(user), Some(pass)) = (field("x-user"), field("x-pass")) else {
        return StatusCode::BAD_REQUEST;
    };
    if !password_ok(user, pass) {
        return StatusCode::UNAUTHORIZED;
    }
    // A successful login forgives the failures before it.
    if let Err(e) = control.reset("login", user.to_owned()).await {
        tracing::warn!(error = %e, "could not reset the login limit");
    }
    StatusCode::OK
}

/// Lets a request through only with the admin token.
async fn admin_auth(req: Request, next: Next) -> Response {
    match req.headers().get("x-admin-token") {
        Some(t) if t == ADMIN_TOKEN => next.run(req).await,
        _ => (StatusCode::UNAUTHORIZED, "admin token required").into_response(),
    }
}

/// A control error as an HTTP answer.
fn error(e: ControlError) -> Response {
    let status = match e {
        ControlError::UnknownRule(_) => StatusCode::NOT_FOUND,
        ControlError::DynamicQuota(_) => StatusCode::CONFLICT,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, e.to_string()).into_response()
}

fn state(d: Decision) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "allowed": d.is_allowed(),
        "remaining": d.remaining(),
        "retry_after_ms": d.retry_after().map(|w| w.as_millis() as u64),
    }))
}

async fn peek(State(c): State<Control>, Path((rule, key)): Path<(String, String)>) -> Response {
    c.peek(&rule, key)
        .await
        .map_or_else(error, |d| state(d).into_response())
}

async fn reset(State(c): State<Control>, Path((rule, key)): Path<(String, String)>) -> Response {
    c.reset(&rule, key)
        .await
        .map_or_else(error, |()| StatusCode::NO_CONTENT.into_response())
}

async fn penalize(
    State(c): State<Control>,
    Path((rule, key, n)): Path<(String, String, u32)>,
) -> Response {
    c.penalize(&rule, key, n)
        .await
        .map_or_else(error, |d| state(d).into_response())
}

async fn reward(
    State(c): State<Control>,
    Path((rule, key, n)): Path<(String, String, u32)>,
) -> Response {
    c.reward(&rule, key, n)
        .await
        .map_or_else(error, |d| state(d).into_response())
}

async fn block(
    State(c): State<Control>,
    Path((rule, key)): Path<(String, String)>,
    Query(q): Query<std::collections::HashMap<String, u64>>,
) -> Response {
    let Some(secs) = q.get("secs") else {
        return (StatusCode::BAD_REQUEST, "?secs= is required").into_response();
    };
    c.block(&rule, key, Duration::from_secs(*secs))
        .await
        .map_or_else(error, |()| StatusCode::NO_CONTENT.into_response())
}

async fn unblock(State(c): State<Control>, Path((rule, key)): Path<(String, String)>) -> Response {
    c.unblock(&rule, key)
        .await
        .map_or_else(error, |()| StatusCode::NO_CONTENT.into_response())
}

/// `/login` behind the limiter, `/admin/limits/...` behind the admin token.
pub fn app() -> Result<Router, BuildError> {
    let limiter = RateLimitLayer::builder().rule(login_rule()).build()?;
    let control = limiter.control();
    let admin = Router::new()
        .route("/limits/{rule}/{key}", get(peek))
        .route("/limits/{rule}/{key}/reset", post(reset))
        .route("/limits/{rule}/{key}/penalize/{n}", post(penalize))
        .route("/limits/{rule}/{key}/reward/{n}", post(reward))
        .route("/limits/{rule}/{key}/block", post(block))
        .route("/limits/{rule}/{key}/unblock", post(unblock))
        .layer(middleware::from_fn(admin_auth));
    let login = Router::new().route("/login", get(login)).layer(limiter);
    Ok(login.nest("/admin", admin).with_state(control))
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
    axum::serve(listener, app()?).await?;
    Ok(())
}
