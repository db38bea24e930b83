//! A rate limit placed before the layer that sets its key (auth), in each
//! documented pattern for anonymous users, over HTTP: every request it
//! lets through unkeyed (`optional_extension`) or counts on its fallback's
//! key (`OnMissingKey::Fallback(peer_ip())`) is counted, and it warns at
//! once; placed after auth, it says nothing.

use std::net::SocketAddr;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Router, routing::get};
use keyed_rate_limit::observe::DECISIONS_TOTAL;
use keyed_rate_limit::{Key, KeyExtractor, OnMissingKey, Quota, RateLimitLayer, Rule};

use crate::support::events::{capture, with_message};
use crate::support::metrics::{counter, snapshotter};

#[derive(Clone)]
struct User(String);

/// Signs in whoever sends `x-user`.
async fn auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .map(|v| v.to_str().unwrap().to_owned());
    if let Some(u) = user {
        req.extensions_mut().insert(User(u));
    }
    next.run(req).await
}

async fn serve(rule: Rule, limit_first: bool) -> SocketAddr {
    let limit = RateLimitLayer::builder().rule(rule).build().unwrap();
    let router = Router::new().route("/", get(|| async { "ok" }));
    // The last layer added runs first.
    let app = if limit_first {
        router.layer(middleware::from_fn(auth)).layer(limit)
    } else {
        router.layer(limit).layer(middleware::from_fn(auth))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn signed_in(addr: SocketAddr, n: usize) {
    let c = crate::support::client();
    for i in 0..n {
        let res = c
            .get(format!("http://{addr}/"))
            .header("x-user", format!("user-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
}

const WARNING: &str = "has not found its own key";

#[tokio::test]
async fn a_limit_before_auth_is_counted_and_warns_at_once() {
    snapshotter();
    let (events, _guard) = capture();
    let user = |u: &User| Key::from(u.0.clone());
    let cases = [
        (
            "misplaced-optional",
            Rule::new(
                "misplaced-optional",
                KeyExtractor::optional_extension(user),
                Quota::per_minute(100),
            ),
            "unkeyed",
        ),
        (
            "misplaced-fallback",
            Rule::new(
                "misplaced-fallback",
                KeyExtractor::extension(user),
                Quota::per_minute(100),
            )
            .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip())),
            "fallback_key",
        ),
    ];
    for (name, rule, outcome) in cases {
        let addr = serve(rule.clone(), true).await;
        signed_in(addr, 5).await;
        assert_eq!(counter(DECISIONS_TOTAL, name, outcome), 5, "{name}");
        let warned: Vec<_> = with_message(&events, WARNING)
            .into_iter()
            .filter(|e| e.get("rule").is_some_and(|r| r == name))
            .collect();
        assert_eq!(
            warned.len(),
            1,
            "{name}: at once, then at most one a minute"
        );
        assert_eq!(warned[0]["outcome"], outcome);
        // After auth: the rule's own key, nothing to say.
        let fixed = format!("{name}-fixed");
        let rule = Rule::new(
            fixed.clone(),
            KeyExtractor::optional_extension(user),
            Quota::per_minute(100),
        );
        let addr = serve(rule, false).await;
        signed_in(addr, 5).await;
        assert_eq!(counter(DECISIONS_TOTAL, &fixed, "unkeyed"), 0);
        assert_eq!(counter(DECISIONS_TOTAL, &fixed, "allow"), 5);
        assert!(
            with_message(&events, WARNING)
                .iter()
                .all(|e| e.get("rule").is_none_or(|r| *r != fixed)),
            "{fixed}"
        );
    }
}

/// A header key with the per-IP fallback (the quickstart's pattern): a
/// client without the header is counted on the fallback's key, but no
/// layer is misplaced, so nothing warns.
#[tokio::test]
async fn a_missing_header_is_counted_not_warned_about() {
    snapshotter();
    let (events, _guard) = capture();
    let rule = Rule::new(
        "header-fallback",
        KeyExtractor::header("x-api-key"),
        Quota::per_minute(100),
    )
    .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip()));
    let addr = serve(rule, true).await;
    signed_in(addr, 3).await;
    assert_eq!(
        counter(DECISIONS_TOTAL, "header-fallback", "fallback_key"),
        3
    );
    assert!(
        with_message(&events, WARNING)
            .iter()
            .all(|e| e.get("rule").is_none_or(|r| r != "header-fallback")),
        "a header is the client's choice"
    );
}
