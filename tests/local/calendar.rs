//! Calendar quotas on local rules, over HTTP: the window is the calendar's
//! (or aligned on the clock, as envoyproxy/ratelimit counts), and the
//! headers say how long it is and when it ends.

use std::time::Duration;

use crate::support::{calendar_window_now, client, envoy_reset, header, ok_app, serve, sf};

use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

#[tokio::test]
async fn day_and_month_quotas_reset_at_their_boundaries() {
    for (name, q) in [
        ("daily", Quota::per_calendar_day(2)),
        (
            "monthly",
            Quota::per_calendar_month(2).with_utc_offset(-8 * 3600),
        ),
    ] {
        let layer = RateLimitLayer::builder()
            .rule(Rule::new(name, KeyExtractor::everyone(), q))
            .build()
            .unwrap();
        let url = serve(ok_app(layer)).await;
        let c = client();
        let (left, window) = calendar_window_now(&q);
        for remaining in [1, 0] {
            let res = c.get(&url).send().await.unwrap();
            assert_eq!(res.status(), 200, "{name}");
            let policy = sf::member(&res, "ratelimit-policy", name);
            assert_eq!(policy.int("w"), Some(window as i64), "{name}");
            assert_eq!(policy.int("q"), Some(2), "{name}");
            let rl = sf::member(&res, "ratelimit", name);
            assert_eq!(rl.int("r"), Some(remaining), "{name}");
            // Every unit comes back at the boundary.
            let t = rl.int("t").unwrap() as u64;
            assert!(t.abs_diff(left) <= 2, "{name}: t={t}, boundary in {left}s");
        }
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 429, "{name}");
        let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        assert!(
            retry.abs_diff(left) <= 2,
            "{name}: Retry-After {retry}, boundary in {left}s"
        );
        assert!((28 * 86_400..=31 * 86_400).contains(&window) || window == 86_400);
    }
}

/// envoyproxy/ratelimit's week, as it counts: spent, the key is refused
/// until the next whole week since the epoch (a Thursday, 00:00 UTC), and
/// `t` and `Retry-After` say when, `len - now % len`.
#[tokio::test]
async fn an_aligned_week_refuses_until_its_edge_as_envoy_counts() {
    let len = 7 * 86_400;
    let q = Quota::aligned(2, Duration::from_secs(len));
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("weekly", KeyExtractor::header("x-key"), q))
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let c = client();
    let send = |key: &'static str| c.get(&url).header("x-key", key).send();
    for remaining in [1, 0] {
        let res = send("k").await.unwrap();
        assert_eq!(res.status(), 200);
        let policy = sf::member(&res, "ratelimit-policy", "weekly");
        assert_eq!(
            (policy.int("q"), policy.int("w")),
            (Some(2), Some(len as i64))
        );
        let rl = sf::member(&res, "ratelimit", "weekly");
        assert_eq!(rl.int("r"), Some(remaining));
        let (t, left) = (rl.int("t").unwrap() as u64, envoy_reset(len, 0));
        assert!(t.abs_diff(left) <= 1, "t={t}, envoy's reset {left}");
    }
    for _ in 0..2 {
        let res = send("k").await.unwrap();
        assert_eq!(res.status(), 429);
        let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        let left = envoy_reset(len, 0);
        assert!(
            retry.abs_diff(left) <= 1,
            "Retry-After {retry}, envoy's {left}"
        );
        let t = sf::member(&res, "ratelimit", "weekly").int("t").unwrap() as u64;
        assert!(t.abs_diff(left) <= 1, "t={t}, envoy's reset {left}");
    }
    assert_eq!(
        send("other").await.unwrap().status(),
        200,
        "a count per key"
    );
}

#[test]
fn a_bad_calendar_quota_is_a_build_error() {
    for (q, why) in [
        (
            Quota::per_calendar_day(10).with_burst(5),
            "a calendar quota has no burst",
        ),
        (
            Quota::per_calendar_month(10).with_utc_offset(86_400),
            "the UTC offset is a day or more",
        ),
        (
            Quota::per_minute(10).with_utc_offset(3600),
            "a UTC offset needs a calendar quota",
        ),
        (
            Quota::aligned(10, Duration::from_millis(1500)),
            "an aligned window is not a whole number of seconds",
        ),
        (
            Quota::aligned(10, Duration::from_secs(101 * 365 * 86_400)),
            "an aligned window is longer than 100 years",
        ),
        (
            Quota::aligned(10, Duration::from_secs(60)).with_burst(5),
            "a calendar quota has no burst",
        ),
    ] {
        let err = RateLimitLayer::builder()
            .rule(Rule::new("r", KeyExtractor::everyone(), q))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
    let described = RateLimitLayer::builder()
        .rule(Rule::new(
            "m",
            KeyExtractor::everyone(),
            Quota::per_calendar_month(9).with_utc_offset(19_800),
        ))
        .build()
        .unwrap()
        .describe();
    let rule = &described.rules()[0];
    assert_eq!(rule.quota, "9/calendar_month, utc_offset +05:30");
    assert_eq!(rule.algorithm, "calendar window");
    let described = RateLimitLayer::builder()
        .rule(Rule::new(
            "a",
            KeyExtractor::everyone(),
            Quota::aligned(50, Duration::from_secs(900)).with_utc_offset(-3600),
        ))
        .build()
        .unwrap()
        .describe();
    let rule = &described.rules()[0];
    assert_eq!(rule.quota, "50/aligned_15min, utc_offset -01:00");
    assert_eq!(rule.algorithm, "aligned window");
    assert_eq!(
        Duration::from_secs(31 * 86_400),
        Quota::per_calendar_month(1).window()
    );
}

/// A local calendar quota's refund that arrives after its day ended is
/// void: the next day keeps its count (tests/support/late_refund.rs).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn a_refund_after_its_day_ended_never_credits_the_next() {
    use crate::support::late_refund::{late_refund, midnight_in, refunding};
    let day = keyed_rate_limit::Quota::per_calendar_day(2)
        .with_utc_offset(midnight_in(std::time::Duration::from_secs(2)));
    let rule = keyed_rate_limit::Rule::new(
        "late-local-cal",
        keyed_rate_limit::KeyExtractor::header("x-key"),
        day,
    );
    let layer = keyed_rate_limit::RateLimitLayer::builder()
        .rule(refunding(rule))
        .build()
        .unwrap();
    let end = || day.calendar_window(std::time::SystemTime::now()).unwrap().1;
    let counts = late_refund(layer, "late-local-cal", end, false).await;
    assert_eq!(counts, (2, 0), "the next day keeps its count");
}

/// "Per day" says one thing per word, in a rules file as in code: `"2/day"`
/// is a rolling day, `Quota::new(2, 86_400 s)` (under GCRA a unit comes
/// back every 12 hours), and `"2/calendar_day"` is
/// `Quota::per_calendar_day(2)` (every unit comes back at midnight UTC).
#[cfg(feature = "config")]
#[tokio::test]
async fn a_day_in_a_rules_file_means_what_it_means_in_code() {
    use keyed_rate_limit::{Registry, RulesConfig};

    const FILE: &str = r#"
[[rules]]
name = "rolling"
key = "everyone"
quota = "2/day"

[[rules]]
name = "calendar"
key = "everyone"
quota = "2/calendar_day"
"#;
    let day = Duration::from_secs(86_400);
    let calendar = Quota::per_calendar_day(2);
    let from_file = RulesConfig::from_toml_str(FILE)
        .unwrap()
        .into_layer(&Registry::new())
        .unwrap();
    let in_code = RateLimitLayer::builder()
        .rule(Rule::new(
            "rolling",
            KeyExtractor::everyone(),
            Quota::new(2, day),
        ))
        .rule(Rule::new("calendar", KeyExtractor::everyone(), calendar))
        .build()
        .unwrap();
    let c = client();
    for (how, layer) in [("file", from_file), ("code", in_code)] {
        let url = serve(ok_app(layer)).await;
        let (left, _) = calendar_window_now(&calendar);
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200, "{how}");
        for name in ["rolling", "calendar"] {
            let policy = sf::member(&res, "ratelimit-policy", name);
            assert_eq!(
                (policy.int("q"), policy.int("w")),
                (Some(2), Some(86_400)),
                "{how} {name}"
            );
            assert_eq!(
                sf::member(&res, "ratelimit", name).int("r"),
                Some(1),
                "{how} {name}"
            );
        }
        let t = |name| sf::member(&res, "ratelimit", name).int("t").unwrap() as u64;
        assert_eq!(
            t("rolling"),
            12 * 3600,
            "{how}: the rolling day gives a unit back in 12 h"
        );
        assert!(
            t("calendar").abs_diff(left) <= 2,
            "{how}: the calendar day gives its units back at midnight UTC, in {left} s, not {} s",
            t("calendar")
        );
    }
}
