//! The RateLimit header fields to the letter of draft -10, read back with a
//! real structured-field parser: `t` is the wait for more quota, and on a
//! 429 it equals `Retry-After`, for the local limiter and the concurrency
//! limiter (on Redis: tests/redis/draft.rs).

use std::time::Duration;

use crate::support::draft::{LIMIT, WINDOW, check, concurrency_deny, exchange};
use crate::support::sf::member;
use crate::support::{client, header, ok_app, serve};

use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule};

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

#[tokio::test]
async fn a_concurrency_deny_has_t_equal_to_retry_after() {
    let layer = ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-api-key"), 1)
        .retry_after(Duration::from_millis(2500))
        .build()
        .unwrap();
    concurrency_deny(layer).await;
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
