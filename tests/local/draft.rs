//! The RateLimit header fields to the letter of draft -10, read back with a
//! real structured-field parser: `t` is the wait for more quota, and on a
//! 429 it equals `Retry-After`, for the local limiter, every Redis algorithm,
//! the concurrency limiter and a fail-closed refusal.

use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support::Backend as _;
use crate::support::sf::{Member, member};
use crate::support::{client, header, ok_app, serve};
use axum::{Router, routing::get};
use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};
use tokio::sync::oneshot;

const LIMIT: u32 = 5;
const WINDOW: Duration = Duration::from_secs(10);

/// One response as a client reads it.
#[derive(Debug)]
struct Seen {
    status: u16,
    retry_after: Option<u64>,
    policy: Member,
    state: Member,
}

async fn seen(res: reqwest::Response, rule: &str) -> Seen {
    Seen {
        status: res.status().as_u16(),
        retry_after: header(&res, "retry-after").map(|v| v.parse().unwrap()),
        policy: member(&res, "ratelimit-policy", rule),
        state: member(&res, "ratelimit", rule),
    }
}

/// `LIMIT + 1` requests for one key: the quota, then a deny.
async fn exchange(url: &str, key: &str, rule: &str) -> Vec<Seen> {
    let c = client();
    let mut out = Vec::new();
    for _ in 0..=LIMIT {
        let res = c.get(url).header("x-api-key", key).send().await.unwrap();
        out.push(seen(res, rule).await);
    }
    out
}

/// What every algorithm must show: a constant policy, `r` counting down,
/// `t` within `t_max` on allows, and on the deny `t` equal to a
/// `Retry-After` that is never 0.
fn check(label: &str, seen: &[Seen], t_max: i64) {
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.policy.int("q"), Some(i64::from(LIMIT)), "{label} {s:?}");
        assert_eq!(s.policy.int("w"), Some(10), "{label} {s:?}");
        assert_eq!(
            s.policy, seen[0].policy,
            "{label}: RateLimit-Policy is constant"
        );
        let (r, t) = (s.state.int("r").unwrap(), s.state.int("t").unwrap());
        if i < LIMIT as usize {
            assert_eq!((s.status, s.retry_after), (200, None), "{label} {s:?}");
            assert_eq!(r, i64::from(LIMIT) - 1 - i as i64, "{label} {s:?}");
            assert!(
                (1..=t_max).contains(&t),
                "{label}: spent, so more comes in 1..={t_max} s: {s:?}"
            );
        } else {
            assert_eq!(s.status, 429, "{label} {s:?}");
            let retry = s.retry_after.expect("a deny says when to retry");
            assert!(retry >= 1, "{label}: never 0");
            assert_eq!(
                (r, t),
                (0, retry as i64),
                "{label}: t is the Retry-After on a 429"
            );
        }
    }
}

#[tokio::test]
async fn local_t_is_the_next_unit_and_the_retry_after() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "local",
            KeyExtractor::header("x-api-key"),
            Quota::new(LIMIT, WINDOW),
        ))
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let seen = exchange(&format!("{url}/"), "k", "local").await;
    // One unit every 2 s: the next is never further.
    check("local", &seen, 2);
    assert!(seen.iter().all(|s| s.state.int("t") == Some(2)), "{seen:?}");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn every_redis_algorithm_gives_t_per_the_draft() {
    use keyed_rate_limit::Algorithm;
    let server = keyed_rate_limit_testing::RedisServer::start();
    for (algo, t_max) in [
        // Smooth refill: a unit every 2 s.
        (Algorithm::Gcra, 2),
        (Algorithm::TokenBucket, 2),
        // Units come back when the window ends...
        (Algorithm::FixedWindow, 10),
        // ...or as the previous window's weight decays, up to two windows.
        (Algorithm::SlidingWindow, 20),
    ] {
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new(
                    "global",
                    KeyExtractor::header("x-api-key"),
                    Quota::new(LIMIT, WINDOW),
                )
                .global(server.backend(&format!("draft-{algo}")).await)
                .algorithm(algo)
                .redis_timeout(Duration::from_millis(500)),
            )
            .instances(1)
            .build()
            .unwrap();
        let url = serve(ok_app(layer)).await;
        let seen = exchange(&format!("{url}/"), "k", "global").await;
        check(algo.as_str(), &seen, t_max);
    }
}

/// A concurrency limit of one, with the slot held by a request that waits.
async fn concurrency_deny(layer: ConcurrencyLimitLayer) {
    let (hold_tx, hold_rx) = oneshot::channel::<()>();
    let hold = std::sync::Arc::new(tokio::sync::Mutex::new(Some(hold_rx)));
    let app = Router::new()
        .route(
            "/hold",
            get(move || {
                let hold = hold.clone();
                async move {
                    if let Some(rx) = hold.lock().await.take() {
                        let _ = rx.await;
                    }
                    "held"
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    let held = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move {
            c.get(format!("{url}/hold"))
                .header("x-api-key", "k")
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    // Bounded: the held request takes its slot within a few tries.
    let mut refused = None;
    for _ in 0..1000 {
        let res = c
            .get(format!("{url}/"))
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        if res.status() == 429 {
            refused = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let refused = refused.expect("the second request is refused while the first is held");
    let retry: i64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    let state = member(&refused, "ratelimit", "exports");
    let policy = member(&refused, "ratelimit-policy", "exports");
    assert_eq!(policy.string("qu").as_deref(), Some("concurrent-requests"));
    assert!(retry >= 1);
    assert_eq!(
        (state.int("r"), state.int("t")),
        (Some(0), Some(retry)),
        "t is the Retry-After"
    );
    hold_tx.send(()).unwrap();
    assert_eq!(held.await.unwrap(), 200);
}

#[tokio::test]
async fn a_concurrency_deny_has_t_equal_to_retry_after() {
    let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-api-key"), 1)
        .retry_after(Duration::from_millis(2500))
        .build()
        .unwrap();
    concurrency_deny(layer).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_global_concurrency_deny_has_t_equal_to_retry_after() {
    let server = keyed_rate_limit_testing::RedisServer::start();
    let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-api-key"), 1)
        .global(server.backend("draft-lease").await)
        .redis_timeout(Duration::from_millis(500))
        .instances(1)
        .build()
        .unwrap();
    concurrency_deny(layer).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_fail_closed_deny_has_t_equal_to_retry_after_the_breakers_wait() {
    use keyed_rate_limit::failure::BreakerConfig;
    use keyed_rate_limit::failure::FailureMode;
    let mut server = keyed_rate_limit_testing::RedisServer::start();
    let open_for = Duration::from_secs(30);
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "closed",
                KeyExtractor::header("x-api-key"),
                Quota::new(LIMIT, WINDOW),
            )
            .global(server.backend("draft-closed").await)
            .on_redis_failure(FailureMode::FailClosed)
            .redis_timeout(Duration::from_millis(500))
            .circuit_breaker(BreakerConfig::default().open_for(open_for)),
        )
        .instances(1)
        .build()
        .unwrap();
    let url = format!("{}/", serve(ok_app(layer.clone())).await);
    server.kill();
    for _ in 0..3 {
        let res = client()
            .get(&url)
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        let s = seen(res, "closed").await;
        assert_eq!(s.status, 429, "{s:?}");
        let retry = s.retry_after.unwrap();
        assert_eq!(s.state.int("t"), Some(retry as i64), "{s:?}");
        assert!((1..=30).contains(&retry), "the breaker's wait: {s:?}");
        if let Some(left) = layer.breakers()[0].reopens_in {
            assert!(
                retry >= left.as_secs(),
                "never earlier than the probe: {s:?} {left:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_hidden_rule_denies_with_retry_after_but_shows_nothing() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "shown",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(100),
        ))
        .rule(
            Rule::new(
                "abuse",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(1),
            )
            .hidden(true),
        )
        .build()
        .unwrap();
    let url = format!("{}/", serve(ok_app(layer)).await);
    let c = client();
    let ok = c.get(&url).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let policy = header(&ok, "ratelimit-policy").unwrap();
    assert_eq!(crate::support::sf::members(&policy).len(), 1, "{policy}");
    let res = c.get(&url).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(
        header(&res, "retry-after").is_some(),
        "a hidden rule's 429 still says when"
    );
    // A 429 shows the refusing rule's members only; this one is hidden, and
    // `shown`'s unit was given back, so its numbers would be stale.
    assert_eq!(header(&res, "ratelimit"), None);
    assert_eq!(header(&res, "ratelimit-policy"), None);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    // The body does not name the hidden rule either.
    assert!(
        body.get("violated-policies").is_none() && body.get("rule").is_none(),
        "{body}"
    );
    assert!(!body.to_string().contains("abuse"), "{body}");
}

#[tokio::test]
async fn pk_is_a_prefix_of_the_keys_sha256_as_sf_binary() {
    use sha2::{Digest, Sha256};
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "per-key",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(100),
            )
            .partition_key(true),
        )
        .build()
        .unwrap();
    let url = format!("{}/", serve(ok_app(layer)).await);
    let c = client();
    let mut pks = Vec::new();
    for key in ["alice-key", "bob-key"] {
        let res = c.get(&url).header("x-api-key", key).send().await.unwrap();
        let pk = member(&res, "ratelimit", "per-key")
            .bytes("pk")
            .expect("pk");
        assert_eq!(pk, Sha256::digest(key.as_bytes())[..9].to_vec());
        let policy = member(&res, "ratelimit-policy", "per-key");
        assert!(
            !policy.params.contains_key("pk"),
            "the policy is the same for every key"
        );
        pks.push(pk);
    }
    assert_ne!(pks[0], pks[1], "a client can tell its keys apart");
}

/// After a refund the first rule's numbers are stale: a 429 by the second
/// rule carries its member only, and its `t` is the Retry-After.
#[tokio::test]
async fn a_429_by_a_later_rule_shows_that_rule_only() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "wide",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(3),
        ))
        .rule(Rule::new(
            "narrow",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(1),
        ))
        .build()
        .unwrap();
    let url = format!("{}/", serve(ok_app(layer)).await);
    let c = client();
    let ok = c.get(&url).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let res = c.get(&url).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(res.status(), 429);
    let state = header(&res, "ratelimit").unwrap();
    let members = crate::support::sf::members(&state);
    assert_eq!(members.len(), 1, "{state}");
    assert_eq!(members[0].name, "narrow");
    let t = members[0].int("t").unwrap();
    assert_eq!(t.to_string(), header(&res, "retry-after").unwrap());
    assert_eq!(
        header(&res, "ratelimit-policy").unwrap(),
        "\"narrow\";q=1;w=60"
    );
}
