//! Global rules through the layer, over HTTP, against real `redis-server`
//! processes that the tests kill, restart and pause.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::gateway::{HEALTHY_TIMEOUT, hit, layer_with, until_global};
use crate::support::metrics::{counter, counter_with, gauge, samples, snapshotter};
use crate::support::source_app as app;
use crate::support::{client, header, serve};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::{BreakerConfig, BreakerState, FailureMode};
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

#[tokio::test]
async fn separate_gateways_sharing_redis_admit_the_quota_exactly() {
    let server = RedisServer::start();
    for algo in crate::support::ALGORITHMS {
        let prefix = format!("exact-{algo}");
        let mut urls = Vec::new();
        for _ in 0..3 {
            let layer = RateLimitLayer::builder()
                .decision_extension(true)
                .rule(
                    Rule::new("shared", KeyExtractor::everyone(), Quota::per_hour(20))
                        .global(server.backend(&prefix).await)
                        .algorithm(algo)
                        .redis_timeout(HEALTHY_TIMEOUT),
                )
                .build()
                .unwrap();
            urls.push(serve(app(layer)).await);
        }
        let c = client();
        let mut tasks = Vec::new();
        for i in 0..60 {
            let (c, url) = (c.clone(), urls[i % 3].clone());
            tasks.push(tokio::spawn(async move { hit(&c, &url).await }));
        }
        let mut admitted = 0;
        for t in tasks {
            let (status, body) = t.await.unwrap();
            if status == 200 {
                assert_eq!(body, "global");
                admitted += 1;
            } else {
                assert_eq!(status, 429);
            }
        }
        assert_eq!(
            admitted, 20,
            "{algo}: 3 gateways together admit the quota, no more"
        );
    }
}

#[tokio::test]
async fn headers_come_from_the_script() {
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "api",
                KeyExtractor::header("x-api-key"),
                Quota::new(5, Duration::from_secs(10)),
            )
            .global(server.backend("hdr").await)
            .redis_timeout(HEALTHY_TIMEOUT),
        )
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();
    for left in (0..5).rev() {
        let res = c.get(&url).header("x-api-key", "k").send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "ratelimit-policy").unwrap(),
            r#""api";q=5;w=10"#
        );
        assert_eq!(
            header(&res, "ratelimit").unwrap(),
            format!(r#""api";r={left};t=2"#),
            "one unit comes back every 2 s"
        );
    }
    let res = c.get(&url).header("x-api-key", "k").send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after").unwrap(), "2");
    assert_eq!(header(&res, "ratelimit").unwrap(), r#""api";r=0;t=2"#);
}

#[tokio::test]
async fn killed_redis_fails_open_loudly() {
    snapshotter(); // installed before anything is counted
    let mut server = RedisServer::start();
    let url = serve(app(layer_with(
        server.backend("open").await,
        "kill-open",
        FailureMode::FailOpen,
        Quota::per_hour(2),
    )))
    .await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill();
    for _ in 0..5 {
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200, "fail-open lets everything through");
        assert!(
            res.headers().get("ratelimit").is_none(),
            "no made-up numbers"
        );
        assert_eq!(res.text().await.unwrap(), "fail_open");
    }
    assert_eq!(
        counter("rate_limit_decisions_total", "kill-open", "fail_open"),
        5
    );
    assert!(counter("rate_limit_breaker_opened_total", "kill-open", "") >= 1);
}

#[tokio::test]
async fn killed_redis_fails_closed_with_429_not_503() {
    snapshotter(); // installed before anything is counted
    let mut server = RedisServer::start();
    let url = serve(app(layer_with(
        server.backend("closed").await,
        "kill-closed",
        FailureMode::FailClosed,
        Quota::per_hour(100),
    )))
    .await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill();
    for _ in 0..3 {
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 429);
        let wait: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        assert!(wait >= 1);
    }
    assert_eq!(
        counter("rate_limit_decisions_total", "kill-closed", "fail_closed"),
        3
    );
}

#[tokio::test]
async fn killed_redis_falls_back_to_the_local_share() {
    snapshotter();
    let mut server = RedisServer::start();
    // 10 per hour over 2 instances: a share of 5, of which Redis had
    // counted 1 of 10 (half a unit of the share, rounded up).
    let url = serve(app(layer_with(
        server.backend("fb").await,
        "kill-fallback",
        FailureMode::LocalFallback,
        Quota::per_hour(10),
    )))
    .await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill();
    let mut got = Vec::new();
    for _ in 0..7 {
        got.push(hit(&c, &url).await.0);
    }
    assert_eq!(got, [200, 200, 200, 200, 429, 429, 429]);
    assert_eq!(
        counter(
            "rate_limit_decisions_total",
            "kill-fallback",
            "local_fallback"
        ),
        7
    );
}

#[tokio::test]
async fn restarted_redis_recovers_and_reloads_its_scripts() {
    let mut server = RedisServer::start();
    let layer = layer_with(
        server.backend("restart").await,
        "restart",
        FailureMode::FailOpen,
        Quota::per_hour(1000),
    );
    let url = serve(app(layer.clone())).await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.restart(); // empty: the scripts are gone
    until_global(&c, &url).await;
    assert_eq!(layer.breakers()[0].state, BreakerState::Closed);
    let keys = crate::support::state_keys(&server, "restart:*");
    assert_eq!(
        keys.len(),
        1,
        "the new server holds the rule's state: {keys:?}"
    );
}

#[tokio::test]
async fn a_stalled_redis_times_out_and_the_breaker_opens_then_closes() {
    snapshotter();
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("stall", KeyExtractor::everyone(), Quota::per_hour(1000))
                .global(server.backend("stall").await)
                .on_redis_failure(FailureMode::FailOpen)
                .redis_timeout(Duration::from_millis(100))
                .circuit_breaker(
                    BreakerConfig::default()
                        .failure_threshold(3)
                        .open_for(Duration::from_millis(300)),
                ),
        )
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    assert_eq!(layer.breakers()[0].state, BreakerState::Closed);

    server.pause(); // connections stay open, nothing answers
    for _ in 0..3 {
        assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
    }
    assert_eq!(
        layer.breakers()[0].state,
        BreakerState::Open,
        "3 timeouts open the breaker"
    );
    assert_eq!(
        gauge("rate_limit_breaker_state", "stall"),
        Some(1.0),
        "the gauge says open"
    );
    // While open, requests skip Redis entirely.
    assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
    let snapshot_cause = |cause: &str| {
        counter_with(
            "rate_limit_decisions_total",
            &[("rule", "stall"), ("cause", cause)],
        )
    };
    assert_eq!(snapshot_cause("timeout"), 3);
    assert!(snapshot_cause("circuit_open") >= 1);

    server.resume();
    until_global(&c, &url).await;
    assert_eq!(
        layer.breakers()[0].state,
        BreakerState::Closed,
        "a successful probe closes it"
    );
    assert_eq!(
        gauge("rate_limit_breaker_state", "stall"),
        Some(0.0),
        "and the gauge closed"
    );
    // Each call to Redis was timed, the timed-out ones too.
    assert!(samples("rate_limit_backend_seconds", "stall") >= 5);
}

/// `rate_limit_breaker_opened_total` counts openings, one per outage: the
/// half-open probes that fail while Redis stays away are
/// `rate_limit_breaker_probe_failed_total`, so a dashboard's "breaker
/// openings" reads outages, not minutes of one.
#[tokio::test]
async fn the_breaker_counts_each_outage_once_and_its_failed_probes_apart() {
    snapshotter();
    let server = RedisServer::start();
    let open_for = Duration::from_millis(300);
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("outages", KeyExtractor::everyone(), Quota::per_hour(1000))
                .global(server.backend("outages").await)
                .on_redis_failure(FailureMode::FailOpen)
                .redis_timeout(Duration::from_millis(100))
                .circuit_breaker(
                    BreakerConfig::default()
                        .failure_threshold(3)
                        .open_for(open_for),
                ),
        )
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    let opened = || counter("rate_limit_breaker_opened_total", "outages", "");
    let probes_failed = || counter("rate_limit_breaker_probe_failed_total", "outages", "");
    assert_eq!(hit(&c, &url).await, (200, "global".into()));

    for outage in 1..=2 {
        server.pause(); // connections stay open, nothing answers
        for _ in 0..3 {
            assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
        }
        assert_eq!(layer.breakers()[0].state, BreakerState::Open);
        assert_eq!(opened(), outage, "3 timeouts open the breaker");
        // Each request after `open_for` is a half-open probe, and fails.
        for probe in 1..=3 {
            tokio::time::sleep(open_for + Duration::from_millis(100)).await;
            assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
            assert_eq!(layer.breakers()[0].state, BreakerState::Open);
            assert_eq!(probes_failed(), 3 * (outage - 1) + probe);
        }
        assert_eq!(opened(), outage, "failed probes are not openings");

        server.resume();
        until_global(&c, &url).await;
        assert_eq!(layer.breakers()[0].state, BreakerState::Closed);
    }
    assert_eq!((opened(), probes_failed()), (2, 6));
}

#[tokio::test]
async fn an_abusive_key_is_answered_from_the_deny_cache() {
    let server = RedisServer::start();
    let calls = || server.script_calls();
    let c = client();
    for algo in crate::support::ALGORITHMS {
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(
                Rule::new("abuse", KeyExtractor::everyone(), Quota::per_hour(5))
                    .global(server.backend(&format!("abuse-{algo}")).await)
                    .algorithm(algo)
                    .redis_timeout(HEALTHY_TIMEOUT),
            )
            .build()
            .unwrap();
        let url = serve(app(layer)).await;
        // The first call may load the script (a NOSCRIPT round trip); count after it.
        let mut statuses = vec![hit(&c, &url).await.0];
        let before = calls();
        let mut waits = Vec::new();
        for _ in 0..99 {
            let res = c.get(&url).send().await.unwrap();
            statuses.push(res.status().as_u16());
            if let Some(w) = header(&res, "retry-after") {
                waits.push(w.parse::<u64>().unwrap());
            }
        }
        assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5, "{algo}");
        // Only the 4 more admits asked Redis: the last one left nothing, and
        // its wait until the next unit answers all 95 denies.
        assert_eq!(calls() - before, 4, "{algo}");
        assert_eq!(waits.len(), 95);
        // 5 per hour: the next unit is 12 minutes away; a fixed window ends
        // an hour after its first hit; a sliding window's count decays only
        // after its aligned window ends, then takes 12 minutes more.
        let most = match algo {
            Algorithm::Gcra | Algorithm::TokenBucket => 720,
            Algorithm::FixedWindow => 3600,
            _ => 3600 + 720,
        };
        assert!(
            waits.iter().all(|w| *w > 600 && *w <= most),
            "{algo}: {:?}",
            &waits[..3]
        );
    }
}

/// Rule names may contain `:`: rule `api` with key `v2:victim` and rule
/// `api:v2` with key `victim` must not share one counter.
#[tokio::test]
async fn rules_whose_name_and_key_concatenate_alike_keep_their_own_counters() {
    let server = RedisServer::start();
    let redis = server.backend("collide").await;
    let layer = |name: &str| {
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(
                Rule::new(
                    name,
                    KeyExtractor::header("x-api-key"),
                    Quota::per_minute(3),
                )
                .global(redis.clone())
                .redis_timeout(HEALTHY_TIMEOUT),
            )
            .build()
            .unwrap()
    };
    let api = serve(app(layer("api"))).await;
    let api_v2 = serve(app(layer("api:v2"))).await;
    let c = client();
    let send =
        |url: &str, key: &'static str| c.get(format!("{url}/")).header("x-api-key", key).send();
    for _ in 0..3 {
        assert_eq!(send(&api, "v2:victim").await.unwrap().status(), 200);
    }
    assert_eq!(send(&api, "v2:victim").await.unwrap().status(), 429);
    let res = send(&api_v2, "victim").await.unwrap();
    assert_eq!(res.status(), 200, "the other rule's budget is untouched");
    assert_eq!(
        header(&res, "ratelimit").as_deref(),
        Some("\"api:v2\";r=2;t=20")
    );
}

/// A refused or reset connection is a dead server, not a slow one: it opens
/// the breaker at once instead of after `failure_threshold` timeouts, and
/// `breakers()` says how long until the next probe.
#[tokio::test]
async fn a_killed_redis_opens_the_breaker_on_the_first_lost_connection() {
    let mut server = RedisServer::start();
    let open_for = Duration::from_secs(30);
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("killed", KeyExtractor::everyone(), Quota::per_minute(100))
                .global(server.backend("killed").await)
                .on_redis_failure(FailureMode::FailOpen)
                .redis_timeout(HEALTHY_TIMEOUT)
                .circuit_breaker(
                    BreakerConfig::default()
                        .failure_threshold(5)
                        .open_for(open_for),
                ),
        )
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    let status = &layer.breakers()[0];
    assert_eq!(
        (&*status.rule, status.state, status.reopens_in),
        ("killed", BreakerState::Closed, None)
    );

    server.kill();
    // The first call may find the old socket already closed and reconnect,
    // which is refused: either way one or two requests, not five.
    for _ in 0..2 {
        assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
        if layer.breakers()[0].state == BreakerState::Open {
            break;
        }
    }
    let status = &layer.breakers()[0];
    assert_eq!(status.state, BreakerState::Open, "{status:?}");
    let left = status
        .reopens_in
        .expect("an open breaker says when it probes");
    assert!(left > Duration::ZERO && left <= open_for, "{left:?}");
    assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
    assert_eq!(
        counter_with(
            "rate_limit_decisions_total",
            &[("rule", "killed"), ("cause", "timeout")]
        ),
        0,
        "no request waited for the dead server"
    );
}

/// A reload keeps an unchanged global rule's breaker (no burst of calls to
/// a Redis known to be down) and gives a changed one a fresh breaker.
#[tokio::test]
async fn a_reload_keeps_the_breaker_of_an_unchanged_global_rule() {
    let mut server = RedisServer::start();
    let backend = server.backend("reload").await;
    let rule = |timeout| {
        Rule::new("api", KeyExtractor::everyone(), Quota::per_minute(100))
            .global(backend.clone())
            .on_redis_failure(FailureMode::FailOpen)
            .redis_timeout(timeout)
            .circuit_breaker(BreakerConfig::default().open_for(Duration::from_secs(30)))
    };
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule(HEALTHY_TIMEOUT))
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    assert_eq!(hit(&c, &url).await, (200, "global".into()));
    server.kill();
    for _ in 0..5 {
        hit(&c, &url).await;
        if layer.breakers()[0].state == BreakerState::Open {
            break;
        }
    }
    assert_eq!(layer.breakers()[0].state, BreakerState::Open);
    layer.reload([rule(HEALTHY_TIMEOUT)]).unwrap();
    assert_eq!(layer.breakers()[0].state, BreakerState::Open, "kept");
    assert_eq!(hit(&c, &url).await, (200, "fail_open".into()));
    // Another failure policy: another runtime, its breaker closed.
    layer
        .reload([rule(HEALTHY_TIMEOUT + Duration::from_millis(1))])
        .unwrap();
    assert_eq!(layer.breakers()[0].state, BreakerState::Closed, "fresh");
}

/// Three gateways keep a live count in Redis; the local fallback divides
/// the quota by it, and by two once a gateway has left.
#[tokio::test]
async fn the_local_fallback_divides_by_the_live_gateway_count() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(300);
    let mut backends = Vec::new();
    for i in 0..3 {
        let b = RedisBackend::builder(server.url())
            .prefix("live")
            .live_instances(ttl)
            .instance_id(format!("gateway-{i}"))
            .build()
            .await
            .unwrap();
        backends.push(b);
    }
    // Gateway 0 serves; the others only announce themselves.
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("split", KeyExtractor::header("x-key"), Quota::per_hour(30))
                .global(backends[0].clone())
                .redis_timeout(Duration::from_millis(50)),
        )
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();
    let b0 = backends[0].clone();
    let until_count = |n: u32| {
        let b = b0.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while b.live_instances() != Some(n) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{:?}",
                    b.live_instances()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // While Redis is stopped, the fallback admits this gateway's share.
    let fallback_admits = |key: &'static str| {
        let (c, url) = (c.clone(), url.clone());
        async move {
            let mut admitted = 0;
            for _ in 0..40 {
                let res = c.get(&url).header("x-key", key).send().await.unwrap();
                match res.status().as_u16() {
                    200 => {
                        assert_eq!(res.text().await.unwrap(), "fallback");
                        admitted += 1;
                    }
                    status => assert_eq!(status, 429),
                }
            }
            admitted
        }
    };
    until_count(3).await;
    // Every gateway counts the others within a third of the TTL.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !backends.iter().all(|b| b.live_instances() == Some(3)) {
        assert!(tokio::time::Instant::now() < deadline, "gateways disagree");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.pause();
    assert_eq!(
        fallback_admits("k1").await,
        10,
        "30 an hour, three gateways"
    );
    server.resume();
    drop(backends.pop());
    until_count(2).await;
    // A fall takes effect a TTL after it is read.
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    server.pause();
    assert_eq!(fallback_admits("k2").await, 15, "two gateways left");
    server.resume();
}
