//! Keyed decisions made together (`KeyedRules::decide_all`, the
//! rate-limit service's door) on a private `redis-server`: a request's
//! global rules on one Redis go as one script call, each decided as it
//! would be alone (costs, the same rule twice, lockouts and locks), and a
//! call that fails goes to each rule's own failure mode and breaker.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::support::Backend as _;
use keyed_rate_limit::decision::Source;
use keyed_rate_limit::failure::{BreakerConfig, BreakerState, FailureMode};
use keyed_rate_limit::rate_limit::{KeyedAsk, KeyedRules};
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{Algorithm, Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

fn ask(rules: &KeyedRules, rule: &str, key: &'static str, cost: u32) -> KeyedAsk {
    KeyedAsk {
        rule: rules.rule(rule).unwrap(),
        key: Key::from(key),
        cost: NonZeroU32::new(cost).unwrap(),
        quota: None,
    }
}

/// Each decision's remaining units, or `None` for a deny.
async fn decide(rules: &KeyedRules, asks: Vec<KeyedAsk>) -> Vec<(Option<u32>, Source)> {
    let decided = rules.decide_all(asks).await;
    (decided.into_iter())
        .map(|d| {
            let d = d.expect("every rule decides");
            let left = d.decision.is_allowed().then(|| d.decision.remaining());
            (left, d.source)
        })
        .collect()
}

#[tokio::test]
async fn global_rules_on_one_redis_go_in_one_call_each_as_it_would_alone() {
    let redis = RedisServer::start();
    let backend = redis.backend("together").await;
    let rule = |name: &str, q: Quota| {
        Rule::new(name, KeyExtractor::header("x"), q)
            .global(backend.clone())
            .redis_timeout(Duration::from_secs(2))
    };
    let layer = RateLimitLayer::builder()
        .rule(rule("a", Quota::per_minute(5)).algorithm(Algorithm::Gcra))
        .rule(
            rule("b", Quota::per_minute(2))
                .algorithm(Algorithm::FixedWindow)
                .lockout(Lockout::new(
                    2,
                    Duration::from_secs(60),
                    Duration::from_secs(60),
                )),
        )
        .rule(Rule::new(
            "c",
            KeyExtractor::header("x"),
            Quota::per_minute(100),
        ))
        .build()
        .unwrap();
    let rules = layer.keyed();
    // The first decisions load the scripts and read each rule's record.
    decide(
        &rules,
        vec![ask(&rules, "a", "w", 1), ask(&rules, "b", "w", 1)],
    )
    .await;

    let calls = redis.script_calls();
    let asks = ["a", "b", "c", "a"].map(|r| ask(&rules, r, "k", if r == "a" { 2 } else { 1 }));
    let got = decide(&rules, asks.to_vec()).await;
    assert_eq!(
        redis.script_calls() - calls,
        1,
        "one call for a, b and a again"
    );
    let left: Vec<Option<u32>> = got.iter().map(|(left, _)| *left).collect();
    assert_eq!(
        left,
        [Some(3), Some(1), Some(99), Some(1)],
        "in order, each cost"
    );
    assert_eq!(got[2].1, Source::Local);

    // b's limit, then two denies: the second locks the key in Redis.
    let asks = vec![
        ask(&rules, "a", "k", 1),
        ask(&rules, "b", "k", 1),
        ask(&rules, "b", "k", 1),
    ];
    let got = decide(&rules, asks).await;
    assert_eq!(
        got.iter().map(|(left, _)| *left).collect::<Vec<_>>(),
        [Some(0), Some(0), None]
    );
    let decided = rules
        .decide_all([ask(&rules, "b", "k", 1), ask(&rules, "a", "k", 1)])
        .await;
    let b = decided[0].as_ref().unwrap();
    assert_eq!(b.source, Source::Locked, "the second deny locks: {b:?}");
    assert!(b.decision.retry_after().unwrap() > Duration::from_secs(55));
    assert!(
        !decided[1].as_ref().unwrap().decision.is_allowed(),
        "a's 5 spent"
    );
    // Held here now: no call for b.
    let calls = redis.script_calls();
    let got = decide(
        &rules,
        vec![ask(&rules, "b", "k", 1), ask(&rules, "c", "k", 1)],
    )
    .await;
    assert_eq!((got[0].0, got[0].1), (None, Source::Locked));
    assert_eq!(redis.script_calls(), calls);

    // Other keys are each their own, in the same call.
    let asks = vec![
        ask(&rules, "a", "m", 5),
        ask(&rules, "b", "n", 2),
        ask(&rules, "a", "o", 6),
    ];
    let got = decide(&rules, asks).await;
    let left: Vec<Option<u32>> = got.iter().map(|(left, _)| *left).collect();
    assert_eq!(
        left,
        [Some(0), Some(0), None],
        "a cost above the burst never fits"
    );
}

#[tokio::test]
async fn a_shared_call_that_fails_goes_to_each_rules_failure_mode() {
    let redis = RedisServer::start();
    let backend = redis.backend("together-down").await;
    let rule = |name: &str, mode: FailureMode| {
        Rule::new(name, KeyExtractor::header("x"), Quota::per_minute(50))
            .global(backend.clone())
            .on_redis_failure(mode)
            .circuit_breaker(BreakerConfig::default().failure_threshold(1))
    };
    let layer = RateLimitLayer::builder()
        .rule(rule("open", FailureMode::FailOpen).redis_timeout(Duration::from_millis(400)))
        .rule(rule("closed", FailureMode::FailClosed).redis_timeout(Duration::from_millis(200)))
        .build()
        .unwrap();
    let rules = layer.keyed();
    let both = || vec![ask(&rules, "open", "k", 1), ask(&rules, "closed", "k", 1)];
    let got = decide(&rules, both()).await;
    assert_eq!(
        got,
        [(Some(49), Source::Global), (Some(49), Source::Global)]
    );

    redis.pause();
    let started = std::time::Instant::now();
    let got = decide(&rules, both()).await;
    let waited = started.elapsed();
    redis.resume();
    assert_eq!(got[0].1, Source::FailOpen, "{got:?}");
    assert_eq!(got[1].1, Source::FailClosed, "{got:?}");
    // The shortest timeout bounds the call (a paused server answers no
    // pings either); the longer one would have waited twice as long.
    assert!(waited < Duration::from_millis(400 * 2), "{waited:?}");
    let breakers = layer.breakers();
    assert_eq!(breakers.len(), 2);
    for b in &breakers {
        assert_eq!(
            b.state,
            BreakerState::Open,
            "each rule's breaker counted it: {b:?}"
        );
    }
}

#[tokio::test]
async fn rules_that_wait_out_their_denies_each_wait_and_are_admitted() {
    let redis = RedisServer::start();
    let backend = redis.backend("together-wait").await;
    let rule = |name: &str| {
        // A unit every 100 ms, no burst beyond one.
        Rule::new(
            name,
            KeyExtractor::header("x"),
            Quota::new(10, Duration::from_secs(1)).with_burst(1),
        )
        .global(backend.clone())
        .redis_timeout(Duration::from_secs(2))
        .on_deny(keyed_rate_limit::rule::OnDeny::Wait {
            max: Duration::from_secs(5),
            queue: 4,
        })
    };
    let layer = RateLimitLayer::builder()
        .rule(rule("w1"))
        .rule(rule("w2"))
        .build()
        .unwrap();
    let rules = layer.keyed();
    let both = || vec![ask(&rules, "w1", "k", 1), ask(&rules, "w2", "k", 1)];
    for round in 0..3 {
        // From the second round on, both are denied at first and wait.
        let got = decide(&rules, both()).await;
        for (left, source) in got {
            assert_eq!((left, source), (Some(0), Source::Global), "round {round}");
        }
    }
}
