//! Shadow rules over a real server: evaluated, logged and counted, never
//! enforced nor shown. Counters come from the binary's one recorder, under
//! rule names no other test uses; events from this thread's subscriber.

use axum::routing::get;
use axum::{Extension, Router};
use keyed_rate_limit::{
    Key, KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision,
};

use crate::support::{events, metrics, ok_app};

const API_KEY: &str = "secret-key-123";

/// The handler reports what the shadow rule decided.
async fn handler(Extension(d): Extension<RateLimitDecision>) -> String {
    let trial = d.rules().iter().find(|r| &*r.rule == "trial").unwrap();
    format!(
        "shadow={} allowed={}",
        trial.shadow,
        trial.decision.is_allowed()
    )
}

#[tokio::test]
async fn shadow_rules_let_everything_through_and_are_recorded() {
    metrics::snapshotter();
    let (events, _guard) = events::capture();

    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new(
            "visible",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(100),
        ))
        .rule(
            Rule::new(
                "trial",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(2),
            )
            .shadow(true),
        )
        .build()
        .unwrap();
    let app = Router::new().route("/", get(handler)).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = reqwest::Client::new();
    for i in 1..=5u32 {
        let res = client
            .get(format!("http://{addr}/"))
            .header("x-api-key", API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), reqwest::StatusCode::OK, "request {i}");
        assert!(res.headers().get("retry-after").is_none());
        // Only the enforced rule is shown to clients.
        let policies: Vec<_> = res.headers().get_all("ratelimit-policy").iter().collect();
        assert_eq!(policies, ["\"visible\";q=100;w=60"]);
        let state = res.headers()["ratelimit"].to_str().unwrap().to_owned();
        assert!(
            state.starts_with(&format!("\"visible\";r={};", 100 - i)),
            "{state}"
        );
        assert!(!state.contains("trial"));
        let body = res.text().await.unwrap();
        assert_eq!(body, format!("shadow=true allowed={}", i <= 2));
    }

    // Requests 3 to 5 would have been denied: counted as shadow denies only.
    const DECISIONS: &str = "rate_limit_decisions_total";
    assert_eq!(metrics::counter(DECISIONS, "trial", "shadow_deny"), 3);
    // And the second, which left less than a fifth of the quota.
    assert_eq!(metrics::counter(DECISIONS, "trial", "near_limit"), 1);
    // Every decision is counted: the trial's two allows beside its shadow
    // denies, and the visible rule's five allows and nothing else.
    assert_eq!(metrics::counter(DECISIONS, "trial", "allow"), 2);
    assert_eq!(metrics::counter(DECISIONS, "trial", ""), 6);
    assert_eq!(metrics::counter(DECISIONS, "visible", "allow"), 5);
    assert_eq!(metrics::counter(DECISIONS, "visible", ""), 5);

    let fingerprint = Key::from(API_KEY).fingerprint();
    {
        let events = events.lock().unwrap();
        let shadow: Vec<_> = events
            .iter()
            .filter(|e| e.get("message").map(String::as_str) == Some("shadow rule would deny"))
            .collect();
        // Three shadow denies within a second: one line, the counter has all three.
        assert_eq!(shadow.len(), 1, "{events:?}");
        assert_eq!(shadow[0]["suppressed"], "0");
        for e in &shadow {
            assert_eq!(e["rule"], "trial");
            assert_eq!(e["key"], fingerprint);
            assert!(
                e.values().all(|v| !v.contains(API_KEY)),
                "raw key logged: {e:?}"
            );
        }
        assert!(
            events
                .iter()
                .all(|e| e.get("message").map(String::as_str) != Some("rate limited")),
            "nothing was enforced"
        );
    }

    // An enforced deny is logged the same way, and counted as a deny.
    let enforced = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new(
            "enforced",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(1),
        ))
        .build()
        .unwrap();
    let app = ok_app(enforced);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let res = client
            .get(format!("http://{addr}/"))
            .header("x-api-key", API_KEY)
            .send()
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 429]);
    let events = events.lock().unwrap();
    let denied: Vec<_> = events
        .iter()
        .filter(|e| e.get("message").map(String::as_str) == Some("rate limited"))
        .collect();
    assert_eq!(denied.len(), 1, "{events:?}");
    assert_eq!(denied[0]["rule"], "enforced");
    assert_eq!(denied[0]["key"], fingerprint);
    assert!(denied[0]["retry_after_ms"].parse::<u64>().unwrap() > 0);
    assert_eq!(metrics::counter(DECISIONS, "enforced", "deny"), 1);
}
