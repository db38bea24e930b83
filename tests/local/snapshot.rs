//! Local counters across a restart, over HTTP: saved by one layer, loaded
//! by the next with the time between counted as elapsed, converted when a
//! quota changed, and a corrupt or foreign file refused.

use std::time::Duration;

use crate::support::sf::member;
use crate::support::{get_with, ok_app, serve};
use keyed_rate_limit::rule::QuotaChange;
use keyed_rate_limit::snapshot::SnapshotError;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

fn rules(hourly: Quota) -> Vec<Rule> {
    let key = || KeyExtractor::header("x-api-key");
    vec![
        Rule::new("hourly", key(), hourly),
        Rule::new("daily", key(), Quota::per_calendar_day(100)),
    ]
}

async fn get(url: &str, key: &str) -> reqwest::Response {
    get_with(url, &[("x-api-key", key)]).await
}

/// Spends `n` of key `k` over HTTP on a layer of `rules(Quota::per_hour(100))`
/// and returns its snapshot.
async fn saved_after(n: usize) -> Vec<u8> {
    let layer = RateLimitLayer::builder()
        .rules(rules(Quota::per_hour(100)))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..n {
        assert_eq!(get(&url, "k").await.status(), 200);
    }
    let mut saved = Vec::new();
    layer.snapshot(&mut saved).unwrap();
    saved
}

/// The `r` of both rules on the next request of key `k` after restoring `saved`.
async fn next_after_restore(
    saved: &[u8],
    hourly: Quota,
    how: QuotaChange,
) -> (Option<i64>, Option<i64>) {
    let rules = rules(hourly).into_iter().map(|r| r.on_quota_change(how));
    let layer = RateLimitLayer::builder()
        .rules(rules)
        .restore(saved)
        .unwrap()
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let res = get(&url, "k").await;
    assert_eq!(res.status(), 200);
    let r = |rule| member(&res, "ratelimit", rule).int("r");
    (r("hourly"), r("daily"))
}

#[tokio::test]
async fn a_restart_keeps_what_each_key_spent() {
    let saved = saved_after(3).await;
    let same = next_after_restore(&saved, Quota::per_hour(100), QuotaChange::Proportional).await;
    assert_eq!(same, (Some(96), Some(96)), "3 spent before, 1 now");
    // A key the snapshot doesn't hold is whole.
    let layer = RateLimitLayer::builder()
        .rules(rules(Quota::per_hour(100)))
        .restore(&saved[..])
        .unwrap()
        .build()
        .unwrap();
    let res = get(&serve(ok_app(layer)).await, "other").await;
    assert_eq!(member(&res, "ratelimit", "hourly").int("r"), Some(99));
}

#[tokio::test]
async fn a_changed_quota_follows_its_quota_change() {
    let saved = saved_after(80).await;
    // The hourly rule alone, under a new quota.
    let hourly_left = async |how| {
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new(
                    "hourly",
                    KeyExtractor::header("x-api-key"),
                    Quota::per_hour(50),
                )
                .on_quota_change(how),
            )
            .restore(&saved[..])
            .unwrap()
            .build()
            .unwrap();
        layer
            .control()
            .peek("hourly", "k")
            .await
            .unwrap()
            .remaining()
    };
    assert_eq!(hourly_left(QuotaChange::Proportional).await, 10);
    assert_eq!(hourly_left(QuotaChange::AsIs).await, 0);
    assert_eq!(hourly_left(QuotaChange::Reset).await, 50);
}

#[tokio::test]
async fn the_time_down_counts_as_elapsed() {
    // Ten a second: one unit back every 100 ms.
    let q = Quota::per_second(10);
    let rule = || Rule::new("fast", KeyExtractor::header("x-api-key"), q);
    let layer = RateLimitLayer::builder().rule(rule()).build().unwrap();
    layer.control().penalize("fast", "k", 10).await.unwrap();
    let mut saved = Vec::new();
    layer.snapshot(&mut saved).unwrap();
    drop(layer);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let layer = RateLimitLayer::builder()
        .rule(rule())
        .restore(&saved[..])
        .unwrap()
        .build()
        .unwrap();
    let left = layer.control().peek("fast", "k").await.unwrap().remaining();
    // At least the 3 units of 350 ms are back; not the whole bucket.
    assert!((3..10).contains(&left), "{left} left");
}

#[test]
fn corrupt_truncated_and_foreign_files_are_refused() {
    let build = |bytes: &[u8]| {
        RateLimitLayer::builder()
            .rules(rules(Quota::per_hour(100)))
            .restore(bytes)
            .err()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let saved = rt.block_on(saved_after(1));
    assert!(matches!(
        build(&saved[..saved.len() / 2]),
        Some(SnapshotError::Corrupt { .. })
    ));
    assert!(matches!(
        build(b"PK\x03\x04 a zip file"),
        Some(SnapshotError::NotASnapshot)
    ));
    assert!(matches!(build(b""), Some(SnapshotError::NotASnapshot)));
    // The end line must end in exactly one newline.
    let whole = &saved[..saved.len() - 1];
    for tail in [&b""[..], b"\t", b"\x0b", b"\x0c", b"\r", b" ", b"\n\n"] {
        let damaged = [whole, tail].concat();
        let err = build(&damaged).unwrap_or_else(|| panic!("ending {tail:?} restored"));
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
    }
    assert!(build(&saved).is_none(), "the whole file restores");
    let mut tampered = saved.clone();
    let at = tampered.iter().position(|&b| b == b'\n').unwrap() + 9;
    tampered[at] ^= 1;
    let err = build(&tampered).unwrap();
    assert!(err.to_string().contains("corrupt"), "{err}");
}

/// An aligned window's counts come back after a restart, as a calendar
/// day's do; under an aligned window of another length the key starts
/// afresh (its windows are not the saved one's).
#[tokio::test]
async fn an_aligned_window_is_restored_into_the_same_windows_only() {
    let rule = |len| {
        let q = Quota::aligned(10, Duration::from_secs(len));
        Rule::new("aligned", KeyExtractor::header("x-api-key"), q)
    };
    let week = 7 * 86_400;
    let layer = RateLimitLayer::builder().rule(rule(week)).build().unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..3 {
        assert_eq!(get(&url, "k").await.status(), 200);
    }
    let mut saved = Vec::new();
    layer.snapshot(&mut saved).unwrap();
    for (len, want) in [(week, 6), (2 * 86_400, 9)] {
        let layer = RateLimitLayer::builder()
            .rule(rule(len))
            .restore(&saved[..])
            .unwrap()
            .build()
            .unwrap();
        let res = get(&serve(ok_app(layer)).await, "k").await;
        let r = member(&res, "ratelimit", "aligned").int("r");
        assert_eq!(r, Some(want), "restored into an aligned window of {len} s");
    }
}
