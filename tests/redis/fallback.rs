//! The local fallback remembers what Redis said: two gateways over HTTP on
//! one private `redis-server`, which is SIGKILLed. A key Redis refused stays
//! refused, a key with units left keeps at most those (plus what comes
//! back), and only a key never seen starts from the local share, which the
//! live instance count (on by default) makes half the quota: a key spent
//! through one gateway alone starts whole on the other.

use std::time::{Duration, Instant};

use crate::support::gateway::HEALTHY_TIMEOUT;
use crate::support::source_app as app;
use crate::support::{client, header, serve};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

/// One request for `key`: its status, `Retry-After` and remaining units.
async fn ask(c: &reqwest::Client, url: &str, key: &str) -> (u16, Option<u64>, Option<u32>) {
    let res = c.get(url).header("x-key", key).send().await.unwrap();
    let retry = header(&res, "retry-after").map(|v| v.parse().unwrap());
    let remaining = header(&res, "ratelimit").and_then(|v| {
        let r = v.split(';').find_map(|p| p.strip_prefix("r="))?;
        r.parse().ok()
    });
    (res.status().as_u16(), retry, remaining)
}

/// How many of `n` requests for `key` each gateway admits.
async fn admitted(c: &reqwest::Client, urls: &[String], key: &str, n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    for url in urls {
        let mut ok = 0;
        for _ in 0..n {
            ok += usize::from(ask(c, url, key).await.0 == 200);
        }
        out.push(ok);
    }
    out
}

/// A gateway without `instances(n)`: the fallback divides by the live count.
async fn gateway(server: &RedisServer, id: &str) -> (String, RedisBackend) {
    let backend = RedisBackend::builder(server.url())
        .prefix("remember")
        .instance_id(id)
        .build()
        .await
        .unwrap();
    let rule = Rule::new(
        "remember",
        KeyExtractor::header("x-key"),
        Quota::per_minute(10),
    )
    .global(backend.clone())
    .redis_timeout(HEALTHY_TIMEOUT);
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule)
        .build()
        .unwrap();
    (serve(app(layer)).await, backend)
}

#[tokio::test]
async fn the_fallback_starts_each_key_from_what_redis_said() {
    let mut server = RedisServer::start();
    let (a, backend_a) = gateway(&server, "gw-a").await;
    let (b, backend_b) = gateway(&server, "gw-b").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while backend_a.live_instances() != Some(2) || backend_b.live_instances() != Some(2) {
        assert!(Instant::now() < deadline, "the gateways never counted 2");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (c, urls) = (client(), [a.clone(), b.clone()]);

    // 10 a minute: spent on both, then refused by Redis on both.
    for url in &urls {
        for _ in 0..5 {
            assert_eq!(ask(&c, url, "refused").await.0, 200);
        }
    }
    let mut retry = 0;
    for url in &urls {
        let (status, wait, _) = ask(&c, url, "refused").await;
        assert_eq!(status, 429);
        retry = retry.max(wait.unwrap());
    }
    let refused_at = Instant::now();
    // 7 spent, alternating: Redis says 3 remain.
    let mut last = None;
    for i in 0..7 {
        let (status, _, remaining) = ask(&c, &urls[i % 2], "three").await;
        assert_eq!(status, 200);
        last = remaining;
    }
    assert_eq!(last, Some(3));
    // Spent to nothing through B alone: A never had an answer for it.
    for _ in 0..10 {
        assert_eq!(ask(&c, &b, "b-only").await.0, 200);
    }

    server.kill();
    // The bound that holds is per gateway (docs/failure.md): B starts from
    // its empty answer, A, which learned nothing, from its whole share.
    let b_only = admitted(&c, &urls, "b-only", 8).await;
    assert_eq!(b_only, [5, 0], "each gateway from what it learned");
    let fresh = admitted(&c, &urls, "fresh", 8).await;
    assert_eq!(fresh, [5, 5], "a key never seen: half the quota each");
    let three = admitted(&c, &urls, "three", 8).await;
    let total: usize = three.iter().sum();
    assert!(
        (1..=4).contains(&total) && three.iter().all(|n| *n <= 2),
        "3 remained in Redis: at most those and a unit of refill, shared: {three:?}"
    );
    // The refusal holds to its Retry-After, then only refill comes back:
    // one unit in Redis within 3 s more, and one of rounding per gateway.
    let honoured = refused_at + Duration::from_secs(retry);
    let (mut early, mut late) = (0, 0);
    while Instant::now() < honoured + Duration::from_secs(3) {
        for url in &urls {
            let (status, wait, _) = ask(&c, url, "refused").await;
            if status == 200 {
                if Instant::now() < honoured {
                    early += 1;
                } else {
                    late += 1;
                }
            } else {
                assert!(wait.unwrap() >= 1, "a refusal says when to come back");
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(early, 0, "refused by Redis: refused until its Retry-After");
    assert!(late <= 2, "not a fresh quota after it: {late} admitted");
}
