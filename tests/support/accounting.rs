//! Requests as a user, and an app for response accounting (`count_if`,
//! `cost_from_response`): logins that fail, and answers that report what
//! they cost.

use std::time::Duration;

use axum::{Router, routing::get};
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

use super::header;

/// One request as `user`: status and `Retry-After` in seconds.
pub async fn hit(c: &reqwest::Client, url: &str, user: &str) -> (u16, Option<u64>) {
    let res = c.get(url).header("x-user", user).send().await.unwrap();
    let retry = header(&res, "retry-after").map(|v| v.parse().unwrap());
    (res.status().as_u16(), retry)
}

/// One request of [`accounting_app`]'s `/tokens` for user `u` that
/// reports `n` tokens used.
pub fn spend_tokens(
    c: &reqwest::Client,
    url: &str,
    n: &str,
) -> impl Future<Output = reqwest::Result<reqwest::Response>> {
    c.get(format!("{url}/tokens"))
        .header("x-user", "u")
        .header("x-spend", n)
        .send()
}

/// `POST /login` answers 401 unless `x-pass` is `right`; `/tokens` reports
/// the tokens its answer cost in `x-tokens-used`.
pub fn accounting_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/login",
            get(|headers: http::HeaderMap| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if headers.get("x-pass").is_some_and(|p| p == "right") {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::UNAUTHORIZED
                }
            }),
        )
        .route(
            "/tokens",
            get(|headers: http::HeaderMap| async move {
                let used = headers
                    .get("x-spend")
                    .map_or("1".to_owned(), |v| v.to_str().unwrap().to_owned());
                ([("x-tokens-used", used)], "done")
            }),
        )
        .layer(layer)
}

/// What `/tokens` reports it cost, 1 without the header.
pub fn tokens_used(res: &http::response::Parts) -> u32 {
    res.headers
        .get("x-tokens-used")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// How long [`login`] locks a user out.
pub const BLOCK: Duration = Duration::from_secs(900);

/// A login rule keyed by `x-user` that locks a user out for [`BLOCK`]
/// after three refusals in a minute.
pub fn login(quota: Quota) -> Rule {
    Rule::new("login", KeyExtractor::header("x-user"), quota).lockout(Lockout::new(
        3,
        Duration::from_secs(60),
        BLOCK,
    ))
}

/// One login as `alice` with `pass`: the status.
pub async fn login_as(c: &reqwest::Client, url: &str, pass: &str) -> u16 {
    let res = c
        .get(format!("{url}/login"))
        .header("x-user", "alice")
        .header("x-pass", pass)
        .send()
        .await
        .unwrap();
    res.status().as_u16()
}
