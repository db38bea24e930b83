//! Calendar quotas on Redis: the script's date arithmetic against the
//! crate's, on the same instants, and whole decisions on Redis `TIME`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::Backend as _;
use crate::support::{calendar_window_now, client, header, ok_app, serve, sf};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{Algorithm, Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;
use proptest::prelude::*;

/// The function library `calendar_window.lua` starts with, as shipped.
const CALENDAR_LUA: &str = include_str!("../../src/backend/redis/lua/calendar.lua");

/// Runs `calendar_window` in Redis's Lua for each instant: flat start, end pairs.
fn lua_windows(c: &mut redis::Connection, period: &str, offset: i32, at: &[i64]) -> Vec<i64> {
    let script = format!(
        "{CALENDAR_LUA}\nlocal out = {{}}\nfor i = 3, #ARGV do\n  local s, e = calendar_window(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[i]))\n  out[#out + 1] = s\n  out[#out + 1] = e\nend\nreturn out"
    );
    redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .arg(period)
        .arg(offset)
        .arg(at)
        .query(c)
        .expect("EVAL")
}

fn rust_windows(q: Quota, at: &[i64]) -> Vec<i64> {
    at.iter()
        .flat_map(|&t| {
            let (s, e) = q
                .calendar_window(UNIX_EPOCH + Duration::from_secs(t as u64))
                .unwrap();
            let secs = |x: SystemTime| x.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
            [secs(s), secs(e)]
        })
        .collect()
}

fn quota(period: &str, offset: i32) -> Quota {
    let q = if period == "day" {
        Quota::per_calendar_day(1)
    } else {
        Quota::per_calendar_month(1)
    };
    q.with_utc_offset(offset)
}

const OFFSETS: [i32; 5] = [0, 19_800, -28_800, 50_400, -43_200];

#[test]
fn the_script_finds_the_same_boundaries_at_every_month_edge() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    for offset in OFFSETS {
        // Each edge from 1970 to 2400, a second before and on it.
        let month = quota("month", offset);
        let mut edges = Vec::new();
        // From 1971: a window starting before the epoch has no `SystemTime` here.
        let mut t = 365 * 86_400i64;
        while t < 13_569_465_600 {
            let end = rust_windows(month, &[t])[1];
            edges.extend([end - 1, end]);
            t = end;
        }
        for period in ["day", "month"] {
            for chunk in edges.chunks(2_000) {
                let lua = lua_windows(&mut c, period, offset, chunk);
                let rust = rust_windows(quota(period, offset), chunk);
                assert_eq!(lua.len(), rust.len());
                if let Some(i) = (0..lua.len()).find(|&i| lua[i] != rust[i]) {
                    let t = chunk[i / 2];
                    panic!(
                        "{period} at {offset}, t={t}: lua {} rust {}",
                        lua[i], rust[i]
                    );
                }
            }
        }
    }
}

/// Any instants, any offset within a day. A runner, not `proptest!`, so
/// the server is a local that is stopped at the end (a static would outlive
/// the test process's cleanup).
#[test]
fn the_script_agrees_on_random_instants() {
    let server = RedisServer::start();
    let c = std::cell::RefCell::new(server.connection().unwrap());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(16));
    let cases = (
        -86_399i32..86_400,
        proptest::collection::vec(31_536_000i64..13_569_465_600, 1..200),
    );
    runner
        .run(&cases, |(offset, at)| {
            for period in ["day", "month"] {
                prop_assert_eq!(
                    lua_windows(&mut c.borrow_mut(), period, offset, &at),
                    rust_windows(quota(period, offset), &at)
                );
            }
            Ok(())
        })
        .unwrap();
}

#[tokio::test]
async fn a_global_calendar_quota_counts_to_the_boundary_on_every_algorithm_setting() {
    let server = RedisServer::start();
    let b = server.backend("cal").await;
    let key = Key::from("k");
    for (i, algorithm) in crate::support::ALGORITHMS.into_iter().enumerate() {
        let q = Quota::per_calendar_month(3).with_utc_offset(3600 * (i as i32 + 1));
        let (left, window) = calendar_window_now(&q);
        let rule = format!("r{i}");
        let d = b.check(&rule, &key, algorithm, &q, 2).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        assert_eq!(
            d.window(),
            Duration::from_secs(window),
            "the month's own length"
        );
        assert!(
            d.reset().as_secs().abs_diff(left) <= 2,
            "{:?} vs {left}",
            d.reset()
        );
        let d = b.check(&rule, &key, algorithm, &q, 2).await.unwrap();
        assert!(!d.is_allowed(), "a deny does not spend");
        let retry = d.retry_after().unwrap().as_secs();
        assert!(retry.abs_diff(left) <= 2, "{retry} vs {left}");
        assert!(
            b.check(&rule, &key, algorithm, &q, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            !b.check(&rule, &key, algorithm, &q, 1)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            b.check(&rule, &key, algorithm, &q, 4)
                .await
                .unwrap()
                .retry_after()
                .is_none(),
            "a cost above the limit never fits"
        );
    }
    // One hash per rule and key, expiring just past the boundary.
    let keys = crate::support::state_keys(&server, "cal:*");
    assert_eq!(keys.len(), 4);
    assert!(keys.iter().all(|k| k.ends_with(b":cal")), "{keys:?}");
    let mut c = server.connection().unwrap();
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(&keys[0])
        .query(&mut c)
        .unwrap();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let days = (expires - now_ms) / 86_400_000;
    assert!((0..=31).contains(&days), "expires in {days} days");
}

#[tokio::test]
async fn over_http_with_a_local_fallback_that_keeps_the_calendar() {
    let mut server = RedisServer::start();
    let redis: RedisBackend = server.backend("http").await;
    let q = Quota::per_calendar_day(4);
    let layer = RateLimitLayer::builder()
        .instances(2)
        .rule(
            Rule::new("daily", KeyExtractor::everyone(), q)
                .global(redis)
                .algorithm(Algorithm::Gcra)
                .on_redis_failure(FailureMode::LocalFallback)
                .redis_timeout(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let c = client();
    let (left, _) = calendar_window_now(&q);
    for remaining in [3, 2] {
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(
            sf::member(&res, "ratelimit-policy", "daily").int("w"),
            Some(86_400)
        );
        assert_eq!(
            sf::member(&res, "ratelimit", "daily").int("r"),
            Some(remaining)
        );
        let t = sf::member(&res, "ratelimit", "daily").int("t").unwrap() as u64;
        assert!(t.abs_diff(left) <= 2, "{t} vs {left}");
    }
    // Redis gone: this gateway's half of the day, half used as Redis had
    // it, still counted to midnight.
    server.kill();
    let mut codes = Vec::new();
    for _ in 0..4 {
        let res = c.get(&url).send().await.unwrap();
        codes.push(res.status().as_u16());
        if res.status() == 200 {
            assert_eq!(
                sf::member(&res, "ratelimit-policy", "daily").int("q"),
                Some(2)
            );
            assert_eq!(
                sf::member(&res, "ratelimit-policy", "daily").int("w"),
                Some(86_400)
            );
        }
    }
    assert_eq!(codes, [200, 429, 429, 429]);
    let res = c.get(&url).send().await.unwrap();
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!(
        retry.abs_diff(left) <= 2,
        "the share is counted to midnight too: {retry} vs {left}"
    );
}

/// The control handle reads a calendar count made under another limit as
/// the next decision reads it (converted proportionally): 8 of 10 is 4 of
/// 5 (1 left) or 16 of 20 (4 left), and a gateway with that limit then
/// admits exactly what the peek said.
#[tokio::test]
async fn a_calendar_peek_converts_as_the_decision_does() {
    use tower::ServiceExt;
    let server = RedisServer::start();
    let gateway = |limit: u32, redis: RedisBackend| {
        let rule = Rule::new(
            "daily",
            KeyExtractor::header("x-key"),
            Quota::per_calendar_day(limit),
        )
        .global(redis)
        .redis_timeout(Duration::from_millis(500));
        RateLimitLayer::builder().rule(rule).build().unwrap()
    };
    for (to, left) in [(5, 1), (20, 4)] {
        let prefix = format!("cal-peek-{to}");
        let old = gateway(10, server.backend(&prefix).await);
        old.control().penalize("daily", "k", 8).await.unwrap();
        let new = gateway(to, server.backend(&prefix).await);
        let peeked = new.control().peek("daily", "k").await.unwrap().remaining();
        assert_eq!(peeked, left, "8 of 10 read under {to}");
        let mut admitted = 0;
        for _ in 0..30 {
            let req = http::Request::get("/")
                .header("x-key", "k")
                .body(axum::body::Body::empty())
                .unwrap();
            if ok_app(new.clone()).oneshot(req).await.unwrap().status() != 200 {
                break;
            }
            admitted += 1;
        }
        assert_eq!(
            admitted, left,
            "the decisions agree with the peek under {to}"
        );
    }
}
