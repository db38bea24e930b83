//! Any-of groups with global members, over HTTP against a private
//! `redis-server`: a member that awaits Redis inside the group, a group
//! reached after an awaited rule, and a later rule's deny refunding the
//! global member that was charged.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::gateway::HEALTHY_TIMEOUT;
use crate::support::sf::{member, members};
use crate::support::{get_with as get, header, ok_app, serve};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, rule};
use keyed_rate_limit_testing::RedisServer;

fn key() -> KeyExtractor {
    KeyExtractor::header("x-api-key")
}

#[tokio::test]
async fn global_members_are_asked_in_turn_and_refunded() {
    let server = RedisServer::start();
    let redis = server.backend("any-of").await;
    let global = |name: &str, q: Quota, k: KeyExtractor| {
        Rule::new(name, k, q)
            .global(redis.clone())
            .redis_timeout(HEALTHY_TIMEOUT)
    };
    // A global rule first: the group is reached after an await.
    for first in [false, true] {
        let mut b = RateLimitLayer::builder().decision_extension(true);
        if first {
            b = b.rule(global(
                "first",
                Quota::per_hour(100),
                KeyExtractor::everyone(),
            ));
        }
        let tag = if first { "-after-await" } else { "" };
        let layer = b
            .rules(rule::any_of(
                "api",
                [
                    Rule::new(format!("steady{tag}"), key(), Quota::per_hour(2)),
                    global(&format!("pool{tag}"), Quota::per_hour(3), key()),
                ],
            ))
            .rule(global(
                &format!("after{tag}"),
                Quota::per_hour(1),
                KeyExtractor::header("x-after"),
            ))
            .build()
            .unwrap();
        let control = layer.control();
        let url = serve(ok_app(layer)).await;
        let (steady, pool) = (format!("steady{tag}"), format!("pool{tag}"));
        let k = [("x-api-key", "k")];
        // The local member admits; the global one after it is read from
        // Redis for the headers, not spent.
        for left in [1, 0] {
            let res = get(&url, &k).await;
            assert_eq!(res.status(), 200, "{tag}: steady");
            assert_eq!(member(&res, "ratelimit", &steady).int("r"), Some(left));
            assert_eq!(member(&res, "ratelimit", &pool).int("r"), Some(3), "{tag}");
        }
        // The local member refuses; the global one, awaited, admits.
        let res = get(&url, &[("x-api-key", "k"), ("x-after", "a")]).await;
        assert_eq!(res.status(), 200);
        assert_eq!(member(&res, "ratelimit", &steady).int("r"), Some(0));
        assert_eq!(member(&res, "ratelimit", &pool).int("r"), Some(2));
        // `after` refuses: the pool's unit goes back to Redis.
        let res = get(&url, &[("x-api-key", "k"), ("x-after", "a")]).await;
        assert_eq!(res.status(), 429);
        let mut left = 0;
        for _ in 0..100 {
            left = control.peek(&pool, "k").await.unwrap().remaining();
            if left == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(left, 2, "{tag}: the refused request's unit is back");
        for _ in 0..2 {
            assert_eq!(get(&url, &k).await.status(), 200);
        }
        let res = get(&url, &k).await;
        assert_eq!(res.status(), 429, "{tag}: every member refuses");
        let state = members(&header(&res, "ratelimit").unwrap());
        let names: Vec<_> = state.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, [steady.as_str(), pool.as_str()]);
        let retry: i64 = header(&res, "retry-after").unwrap().parse().unwrap();
        assert_eq!(state[1].int("t"), Some(retry), "the pool answers: sooner");
        assert!((1190..=1200).contains(&retry), "{tag}: Retry-After {retry}");
    }
}
