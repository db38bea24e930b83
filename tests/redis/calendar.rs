//! Calendar quotas on Redis: the script's date arithmetic against the
//! crate's, on the same instants, and whole decisions on Redis `TIME`;
//! aligned windows shared by two gateways as envoyproxy/ratelimit counts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::Backend as _;
use crate::support::{
    aligned_edge_in, calendar_window_now, client, envoy_reset, header, ok_app, serve, sf,
};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{Algorithm, Key, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;
use proptest::prelude::*;

/// The function library `calendar_window.lua` starts with, as shipped.
const CALENDAR_LUA: &str = include_str!("../../src/backend/redis/lua/calendar.lua");

/// Runs `calendar_window` in Redis's Lua for each instant: flat start, end pairs.
fn lua_windows(c: &mut redis::Connection, period: Period, at: &[i64]) -> Vec<i64> {
    let script = format!(
        "{CALENDAR_LUA}\nlocal out = {{}}\nfor i = 4, #ARGV do\n  local s, e = calendar_window(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[i]), tonumber(ARGV[3]))\n  out[#out + 1] = s\n  out[#out + 1] = e\nend\nreturn out"
    );
    let (name, len) = match period.len {
        Some(len) => ("aligned", len),
        None => (period.name, 0),
    };
    redis::cmd("EVAL")
        .arg(script)
        .arg(0)
        .arg(name)
        .arg(period.offset)
        .arg(len)
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

/// A calendar period as both sides take it: a day, a month, or an aligned
/// window of `len` seconds; at `offset` seconds east of UTC.
#[derive(Debug, Clone, Copy)]
struct Period {
    name: &'static str,
    len: Option<u64>,
    offset: i32,
}

impl Period {
    fn quota(self) -> Quota {
        let q = match (self.name, self.len) {
            (_, Some(len)) => Quota::aligned(1, Duration::from_secs(len)),
            ("day", None) => Quota::per_calendar_day(1),
            _ => Quota::per_calendar_month(1),
        };
        q.with_utc_offset(self.offset)
    }
}

/// envoyproxy/ratelimit's units, as aligned windows (a month of 30 days, a
/// year of 365), and lengths that divide nothing.
const ALIGNED: [u64; 8] = [1, 60, 3600, 86_400, 604_800, 2_592_000, 31_536_000, 7_777];

/// Every period at `offset`: a day, a month and each aligned length.
fn periods(offset: i32) -> Vec<Period> {
    let named = ["day", "month"].map(|name| Period {
        name,
        len: None,
        offset,
    });
    let aligned = ALIGNED.map(|len| Period {
        name: "aligned",
        len: Some(len),
        offset,
    });
    named.into_iter().chain(aligned).collect()
}

fn assert_agree(c: &mut redis::Connection, period: Period, at: &[i64]) {
    for chunk in at.chunks(2_000) {
        let lua = lua_windows(c, period, chunk);
        let rust = rust_windows(period.quota(), chunk);
        assert_eq!(lua.len(), rust.len());
        if let Some(i) = (0..lua.len()).find(|&i| lua[i] != rust[i]) {
            let t = chunk[i / 2];
            panic!("{period:?}, t={t}: lua {} rust {}", lua[i], rust[i]);
        }
    }
}

const OFFSETS: [i32; 5] = [0, 19_800, -28_800, 50_400, -43_200];

#[test]
fn the_script_finds_the_same_boundaries_at_every_month_edge() {
    let server = RedisServer::start();
    let mut c = server.connection().unwrap();
    for offset in OFFSETS {
        // Each edge from 1970 to 2400, a second before and on it.
        let month = Period {
            name: "month",
            len: None,
            offset,
        };
        let mut edges = Vec::new();
        // From 1971: a window starting before the epoch has no `SystemTime` here.
        let mut t = 365 * 86_400i64;
        while t < 13_569_465_600 {
            let end = rust_windows(month.quota(), &[t])[1];
            edges.extend([end - 1, end]);
            t = end;
        }
        for period in periods(offset) {
            let mut at = edges.clone();
            // An aligned window's own edges near each month's.
            if period.len.is_some() {
                for &t in &edges {
                    let end = rust_windows(period.quota(), &[t])[1];
                    at.extend([end - 1, end]);
                }
            }
            assert_agree(&mut c, period, &at);
        }
    }
}

/// Any instants, any offset within a day, any aligned length up to a
/// year. A runner, not `proptest!`, so the server is a local that is
/// stopped at the end (a static would outlive the test process's cleanup).
#[test]
fn the_script_agrees_on_random_instants() {
    let server = RedisServer::start();
    let c = std::cell::RefCell::new(server.connection().unwrap());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(16));
    let cases = (
        -86_399i32..86_400,
        1u64..=31_536_000,
        // From 1972: no aligned window of a year or less starts before 1970.
        proptest::collection::vec(63_072_000i64..13_569_465_600, 1..200),
    );
    runner
        .run(&cases, |(offset, len, at)| {
            let random = Period {
                name: "aligned",
                len: Some(len),
                offset,
            };
            for period in periods(offset).into_iter().chain([random]) {
                prop_assert_eq!(
                    lua_windows(&mut c.borrow_mut(), period, &at),
                    rust_windows(period.quota(), &at),
                    "{:?}",
                    period
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

/// envoyproxy/ratelimit's windows on Redis: two gateways on one server
/// count one aligned hour together (its edge put half an hour away, so the
/// test never straddles it), and each tells the time to that edge as envoy
/// works it out, `len - now % len` on the shifted clock.
#[tokio::test]
async fn two_gateways_share_an_aligned_window_to_its_edge() {
    let server = RedisServer::start();
    let len = 3600;
    let offset = aligned_edge_in(len, 1800);
    let q = Quota::aligned(3, Duration::from_secs(len)).with_utc_offset(offset);
    let mut urls = Vec::new();
    for _ in 0..2 {
        let rule = Rule::new("hourly", KeyExtractor::header("x-key"), q)
            .global(server.backend("aligned").await)
            .redis_timeout(Duration::from_millis(500));
        let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
        urls.push(serve(ok_app(layer)).await);
    }
    let (a, b) = (&urls[0], &urls[1]);
    let c = client();
    let send = |url: &String| c.get(url).header("x-key", "k").send();
    for (url, remaining) in [(a, 2), (b, 1), (a, 0)] {
        let res = send(url).await.unwrap();
        assert_eq!(res.status(), 200);
        let policy = sf::member(&res, "ratelimit-policy", "hourly");
        assert_eq!((policy.int("q"), policy.int("w")), (Some(3), Some(3600)));
        let rl = sf::member(&res, "ratelimit", "hourly");
        assert_eq!(rl.int("r"), Some(remaining), "one count for both");
        let (t, left) = (rl.int("t").unwrap() as u64, envoy_reset(len, offset));
        assert!(t.abs_diff(left) <= 1, "t={t}, envoy's reset {left}");
    }
    for url in [b, a] {
        let res = send(url).await.unwrap();
        assert_eq!(res.status(), 429);
        let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        let left = envoy_reset(len, offset);
        assert!(
            retry.abs_diff(left) <= 1,
            "Retry-After {retry}, envoy's {left}"
        );
        assert!((1790..=1800).contains(&retry), "the edge, half an hour on");
    }
    // One hash, in the window envoy names: [now - now % len, … + len).
    let keys = crate::support::state_keys(&server, "aligned*");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (start, end): (i64, i64) = redis::cmd("HMGET")
        .arg(&keys[0])
        .arg("s")
        .arg("e")
        .query(&mut server.connection().unwrap())
        .unwrap();
    let edge = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + envoy_reset(len, offset);
    assert_eq!((start, end), (edge as i64 - 3600, edge as i64));
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
