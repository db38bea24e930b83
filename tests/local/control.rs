//! Lockouts, the control handle, refunds and response accounting
//! (`count_if`, `cost_from_response`), over HTTP, on local rules (on
//! Redis: tests/redis/control.rs).

use std::time::Duration;

use crate::support::accounting::{accounting_app, hit, login, login_as, spend_tokens, tokens_used};
use crate::support::source_app as app;
use crate::support::{client, header, serve};
use axum::{Router, routing::get};
use keyed_rate_limit::rate_limit::ControlError;
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

#[tokio::test]
async fn a_local_lockout_blocks_past_the_window_and_the_handle_lifts_it() {
    #[cfg(feature = "metrics")]
    crate::support::metrics::snapshotter();
    let (events, _guard) = crate::support::events::capture();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(login(Quota::per_minute(2)))
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);
    // Two denies with the quota's own wait, then the third locks.
    for _ in 0..2 {
        let (status, retry) = hit(&c, &url, "mallory").await;
        assert_eq!(status, 429);
        assert!(retry.unwrap() <= 60);
    }
    assert_eq!(hit(&c, &url, "mallory").await, (429, Some(900)));
    let (status, retry) = hit(&c, &url, "mallory").await;
    assert_eq!(status, 429);
    assert!(
        (899..=900).contains(&retry.unwrap()),
        "the block's time left"
    );
    assert_eq!(hit(&c, &url, "alice").await.0, 200, "other keys are free");
    let warned = crate::support::events::with_message(&events, "key locked out");
    assert_eq!(warned.len(), 1, "one warning, when the lock starts");
    assert_eq!(warned[0]["block_ms"], "900000");
    assert!(!warned[0]["key"].contains("mallory"), "a fingerprint");
    #[cfg(feature = "metrics")]
    assert!(crate::support::metrics::counter("rate_limit_decisions_total", "login", "locked") >= 2);
    let peek = control.peek("login", "mallory").await.unwrap();
    assert!(peek.retry_after().unwrap() > Duration::from_secs(890));

    // Unblocked, the key is back to its quota, which it had spent.
    control.unblock("login", "mallory").await.unwrap();
    let (status, retry) = hit(&c, &url, "mallory").await;
    assert_eq!(status, 429);
    assert!(retry.unwrap() <= 60, "the quota's wait, not the block's");
    control.reset("login", "mallory").await.unwrap();
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);

    control
        .block("login", "alice", Duration::from_secs(30))
        .await
        .unwrap();
    let (status, retry) = hit(&c, &url, "alice").await;
    assert_eq!(status, 429);
    assert!((29..=30).contains(&retry.unwrap()));
}

#[test]
fn settings_that_cannot_hold_are_build_errors() {
    use keyed_rate_limit::rule::OnDeny;
    let waits = login(Quota::per_minute(2)).on_deny(OnDeny::Wait {
        max: Duration::from_secs(1),
        queue: 10,
    });
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(waits)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("OnDeny::Wait"), "{err}");
    let free = Rule::new("free", KeyExtractor::everyone(), Quota::per_minute(2))
        .cost(0)
        .count_if(|_| true);
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(free)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("reservation"), "{err}");
    let never = Lockout::new(0, Duration::from_secs(1), Duration::from_secs(1));
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("l", KeyExtractor::everyone(), Quota::per_minute(2)).lockout(never))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lockout"), "{err}");
}

/// A client that goes away once the handler runs keeps its reservation:
/// hanging up must not start work for free.
#[tokio::test]
async fn a_request_dropped_in_the_handler_keeps_its_reservation() {
    use std::sync::Arc;
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("login", KeyExtractor::everyone(), Quota::per_hour(3)).count_if(|_| true))
        .build()
        .unwrap();
    let control = layer.control();
    let entered = Arc::new(tokio::sync::Notify::new());
    let e = entered.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let e = e.clone();
                async move {
                    e.notify_one();
                    std::future::pending::<()>().await;
                }
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let pending = tokio::spawn(async move { client().get(url).send().await });
    entered.notified().await;
    assert_eq!(
        control.peek("login", "*").await.unwrap().remaining(),
        2,
        "reserved"
    );
    pending.abort();
    // The connection closes and the server drops the request's future.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        control.peek("login", "*").await.unwrap().remaining(),
        2,
        "kept"
    );
}

#[tokio::test]
async fn the_handle_moves_a_local_bucket_within_empty_and_whole() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new(
            "api",
            KeyExtractor::header("x-user"),
            Quota::per_minute(10),
        ))
        .rule(
            Rule::new("plan", KeyExtractor::header("x-user"), Quota::per_minute(1))
                .quota_fn(|_| Quota::per_minute(5))
                .blockable(true),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(control.peek("api", "u").await.unwrap().remaining(), 10);
    assert_eq!(
        control.penalize("api", "u", 4).await.unwrap().remaining(),
        6
    );
    let res = c.get(&url).header("x-user", "u").send().await.unwrap();
    let ratelimit = header(&res, "ratelimit").unwrap();
    assert!(
        ratelimit.starts_with("\"api\";r=5;t=6,"),
        "requests see the charge: {ratelimit}"
    );
    // Past empty saturates: the next unit waits one interval (6 s).
    let d = control.penalize("api", "u", 1000).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.retry_after().unwrap() <= Duration::from_secs(6));
    assert_eq!(hit(&c, &url, "u").await.0, 429);
    let d = control.reward("api", "u", 1000).await.unwrap();
    assert_eq!(d.remaining(), 10, "never past whole");
    assert_eq!(hit(&c, &url, "u").await.0, 200);

    let err = control.peek("plan", "u").await.unwrap_err();
    assert!(matches!(err, ControlError::DynamicQuota(ref r) if r == "plan"));
    control
        .block("plan", "u", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        hit(&c, &url, "u").await.0,
        429,
        "a quota_fn rule can be blocked"
    );
    let err = control.reset("nope", "u").await.unwrap_err();
    assert_eq!(err.to_string(), "no rule named \"nope\"");
    let err = control
        .block("api", "v", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ControlError::NotBlockable(ref r) if r == "api"),
        "a rule that is not blockable never looks for a lock: {err}"
    );
    assert_eq!(hit(&c, &url, "v").await.0, 200, "not blocked");
    control.unblock("api", "v").await.unwrap();
}

#[tokio::test]
async fn count_if_counts_failed_logins_only_and_a_burst_cannot_overshoot() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("login", KeyExtractor::header("x-user"), Quota::per_hour(3))
                .count_if(|res| res.status == http::StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(login_as(&c, &url, "right").await, 200);
    }
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 3);
    // Ten wrong passwords at once: each reserves its unit before the
    // handler answers, so three get through to fail and seven are refused.
    let attempts: Vec<_> = (0..10)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { login_as(&c, &url, "wrong").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for a in attempts {
        statuses.push(a.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(login_as(&c, &url, "right").await, 429, "spent on failures");
}

#[tokio::test]
async fn cost_from_response_charges_what_the_handler_reports() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "tokens",
                KeyExtractor::header("x-user"),
                Quota::per_hour(100),
            )
            .cost_from_response(tokens_used),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    let spend = |n| spend_tokens(&c, &url, n);
    let res = spend("40").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "done", "the body is untouched");
    assert_eq!(control.peek("tokens", "u").await.unwrap().remaining(), 60);
    assert_eq!(spend("0").await.unwrap().status(), 200);
    assert_eq!(
        control.peek("tokens", "u").await.unwrap().remaining(),
        60,
        "a reported 0 gives the reservation back"
    );
    // Past the bucket: saturated, the next request waits.
    assert_eq!(spend("1000").await.unwrap().status(), 200);
    assert!(!control.peek("tokens", "u").await.unwrap().is_allowed());
    assert_eq!(spend("1").await.unwrap().status(), 429);
}

#[tokio::test]
async fn a_panicking_closure_keeps_the_reservation_and_the_layer_works() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("login", KeyExtractor::header("x-user"), Quota::per_hour(3)).count_if(
                |res| {
                    assert!(res.status != http::StatusCode::OK, "boom");
                    true
                },
            ),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    assert_eq!(
        login_as(&c, &url, "right").await,
        200,
        "the response is out"
    );
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 2);
    assert_eq!(login_as(&c, &url, "wrong").await, 401);
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 1);
}

#[tokio::test]
async fn a_later_deny_gives_back_what_earlier_rules_spent() {
    for refunds in [true, false] {
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(Rule::new(
                "per-user",
                KeyExtractor::header("x-user"),
                Quota::per_hour(10),
            ))
            .rule(Rule::new(
                "everyone",
                KeyExtractor::everyone(),
                Quota::per_hour(1),
            ))
            .refunds(refunds)
            .build()
            .unwrap();
        let control = layer.control();
        let url = serve(app(layer)).await;
        let c = client();
        assert_eq!(hit(&c, &url, "u").await.0, 200);
        for _ in 0..3 {
            assert_eq!(hit(&c, &url, "u").await.0, 429);
        }
        let left = control.peek("per-user", "u").await.unwrap().remaining();
        assert_eq!(left, if refunds { 9 } else { 6 }, "refunds: {refunds}");
    }
}

#[path = "../../examples/admin.rs"]
#[allow(dead_code)]
mod admin;

/// The login recipe and the admin API of `examples/admin.rs`, served.
#[tokio::test]
async fn the_admin_example_locks_out_forgives_and_answers_operators() {
    let url = serve(admin::app().unwrap()).await;
    let c = client();
    let login = |user: &'static str, pass: &'static str| {
        c.get(format!("{url}/login"))
            .header("x-user", user)
            .header("x-pass", pass)
            .send()
    };
    let admin = |method: reqwest::Method, path: &str, token: &str| {
        c.request(method, format!("{url}/admin/limits/{path}"))
            .header("x-admin-token", token)
            .send()
    };
    for _ in 0..3 {
        assert_eq!(login("alice", "wrong").await.unwrap().status(), 401);
    }
    let peek = admin(reqwest::Method::GET, "login/alice", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(peek.status(), 200);
    let body: serde_json::Value = peek.json().await.unwrap();
    assert_eq!(body["remaining"], 2);
    // A successful login forgives the failures.
    assert_eq!(login("alice", "secret").await.unwrap().status(), 200);
    let body: serde_json::Value = admin(reqwest::Method::GET, "login/alice", admin::ADMIN_TOKEN)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["remaining"], admin::FAILURES);
    // Brute force: five failures spend the quota, five refusals lock.
    for _ in 0..admin::FAILURES {
        assert_eq!(login("bob", "guess").await.unwrap().status(), 401);
    }
    for _ in 0..5 {
        assert_eq!(login("bob", "guess").await.unwrap().status(), 429);
    }
    let res = login("bob", "guess").await.unwrap();
    assert_eq!(res.status(), 429);
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!(retry > 800 && retry <= admin::LOCKOUT.as_secs(), "{retry}");
    // The operator lifts it.
    let res = admin(reqwest::Method::POST, "login/bob/reset", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(login("bob", "guess").await.unwrap().status(), 401);
    // Without the token, or for an unknown rule.
    let res = admin(reqwest::Method::POST, "login/bob/reset", "nope")
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let res = admin(reqwest::Method::GET, "nope/bob", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = admin(
        reqwest::Method::POST,
        "login/carol/block?secs=60",
        admin::ADMIN_TOKEN,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(login("carol", "secret").await.unwrap().status(), 429);
}
