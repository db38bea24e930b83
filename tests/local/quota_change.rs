//! A reload that changes a rule's quota keeps each key's usage as the rule's
//! `QuotaChange` says: a key that spent 80 of 100 has 10 of a new 50 under
//! `Proportional`, none under `AsIs`, and 50 under `Reset`; for rolling
//! and calendar quotas, over HTTP.

use crate::support::sf::member;
use crate::support::{get_with, ok_app, serve};
use keyed_rate_limit::rule::QuotaChange;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

fn rule(q: Quota, how: QuotaChange) -> Rule {
    Rule::new("api", KeyExtractor::header("x-api-key"), q).on_quota_change(how)
}

async fn get(url: &str) -> reqwest::Response {
    get_with(url, &[("x-api-key", "k")]).await
}

/// Spends 80 of `from` over HTTP, reloads with `to`, and returns what is
/// left by the control handle, then the next request's status and `r`.
async fn after_reload(from: Quota, to: Quota, how: QuotaChange) -> (u32, u16, Option<i64>) {
    let layer = RateLimitLayer::builder()
        .rule(rule(from, how))
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..80 {
        assert_eq!(get(&url).await.status(), 200);
    }
    layer.reload([rule(to, how)]).unwrap();
    let left = control.peek("api", "k").await.unwrap().remaining();
    let res = get(&url).await;
    let r = (res.status() == 200)
        .then(|| member(&res, "ratelimit", "api").int("r"))
        .flatten();
    (left, res.status().as_u16(), r)
}

#[tokio::test]
async fn a_lowered_quota_keeps_what_each_key_used() {
    let cases = [
        (QuotaChange::Proportional, (10, 200, Some(9))),
        (QuotaChange::AsIs, (0, 429, None)),
        (QuotaChange::Reset, (50, 200, Some(49))),
    ];
    for (how, want) in cases {
        // An hour's quota: what comes back meanwhile is under one unit.
        let rolling = after_reload(Quota::per_hour(100), Quota::per_hour(50), how).await;
        assert_eq!(rolling, want, "rolling, {how:?}");
        let calendar = after_reload(
            Quota::per_calendar_day(100),
            Quota::per_calendar_day(50),
            how,
        )
        .await;
        assert_eq!(calendar, want, "calendar, {how:?}");
    }
    // A new window with the new quota: the fraction of the burst.
    let window = Quota::new(50, std::time::Duration::from_secs(600));
    let got = after_reload(Quota::per_hour(100), window, QuotaChange::Proportional).await;
    assert_eq!(got, (10, 200, Some(9)));
}

#[tokio::test]
async fn raising_a_quota_keeps_the_fraction_or_the_units() {
    let up = |how| after_reload(Quota::per_hour(100), Quota::per_hour(200), how);
    assert_eq!(up(QuotaChange::Proportional).await, (40, 200, Some(39)));
    assert_eq!(up(QuotaChange::AsIs).await, (120, 200, Some(119)));
}

#[test]
fn describe_names_a_quota_change_other_than_the_default() {
    let quota = |how| {
        let layer = RateLimitLayer::builder()
            .rule(rule(Quota::per_hour(100), how))
            .build()
            .unwrap();
        layer.describe().rules()[0].quota.clone()
    };
    assert_eq!(quota(QuotaChange::Proportional), "100/h");
    assert_eq!(quota(QuotaChange::AsIs), "100/h, on change: as_is");
    assert_eq!(quota(QuotaChange::Reset), "100/h, on change: reset");
}

#[tokio::test]
async fn incomparable_quotas_start_afresh() {
    // Rolling to calendar: what was used is not comparable.
    let got = after_reload(
        Quota::per_hour(100),
        Quota::per_calendar_day(50),
        QuotaChange::AsIs,
    )
    .await;
    assert_eq!(got, (50, 200, Some(49)));
}

/// A watched rules file whose quota is lowered: the default keeps the
/// fraction used.
#[cfg(feature = "config")]
#[tokio::test]
async fn a_watched_file_converts_usage_too() {
    use keyed_rate_limit::{Registry, RulesConfig};
    let dir = std::env::temp_dir().join(format!("krl-quota-change-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    let file = |q: &str| {
        format!("[[rules]]\nname = \"api\"\nkey = \"header:x-api-key\"\nquota = \"{q}\"\n")
    };
    std::fs::write(&path, file("100/h")).unwrap();
    let (layer, watcher) = RulesConfig::watch(&path, Registry::new()).unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..80 {
        assert_eq!(get(&url).await.status(), 200);
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, file("50/h")).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    for _ in 0..500 {
        if watcher.reloads() == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(watcher.reloads(), 1, "the edit applied");
    let left = layer.control().peek("api", "k").await.unwrap().remaining();
    assert_eq!(left, 10, "80 % of the new 50 stays used");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "config")]
#[test]
fn rule_files_set_it() {
    use keyed_rate_limit::{Registry, RulesConfig};
    let config = RulesConfig::from_yaml_str(
        "rules:\n  - name: api\n    key: everyone\n    quota: 100/h\n    on_quota_change: as_is\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    assert_eq!(layer.rules()[0].get_on_quota_change(), QuotaChange::AsIs);
    let err = RulesConfig::from_yaml_str(
        "rules:\n  - name: api\n    key: everyone\n    quota: 100/h\n    on_quota_change: keep\n",
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("on_quota_change") || err.to_string().contains("keep"),
        "{err}"
    );
}

/// Spends one unit of `from` for each of 20,000 other keys, then sends 8
/// clients at one key over HTTP and, after about 300 admissions, reloads
/// with `to` (`Proportional`) while they go on. Returns the admissions the
/// old and the new rules made (told apart by `RateLimit-Policy`'s `q`).
async fn reload_under_load(from: Quota, to: Quota) -> (u64, u64) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    use tower::ServiceExt;

    let layer = RateLimitLayer::builder()
        .rule(rule(from, QuotaChange::Proportional))
        .build()
        .unwrap();
    let app = ok_app(layer.clone());
    for i in 0..20_000 {
        let req = http::Request::get("/")
            .header("x-api-key", format!("other-{i}"))
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 200);
    }
    let url = serve(app).await;
    let (old_q, new_q) = (i64::from(from.limit()), i64::from(to.limit()));
    let old_ok = Arc::new(AtomicU64::new(0));
    let new_ok = Arc::new(AtomicU64::new(0));
    let refused_after = Arc::new(AtomicU64::new(0));
    let reloaded = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (url, old_ok, new_ok) = (url.clone(), old_ok.clone(), new_ok.clone());
        let (refused_after, reloaded) = (refused_after.clone(), reloaded.clone());
        clients.push(tokio::spawn(async move {
            let client = crate::support::client();
            let deadline = Instant::now() + Duration::from_secs(60);
            // Bounded: until the new rules have refused 200 times.
            for _ in 0..20_000 {
                if refused_after.load(Ordering::Acquire) >= 200 || Instant::now() > deadline {
                    break;
                }
                let after = reloaded.load(Ordering::Acquire);
                let res = client
                    .get(&url)
                    .header("x-api-key", "hot")
                    .send()
                    .await
                    .unwrap();
                let q = member(&res, "ratelimit-policy", "api").int("q");
                match (res.status().as_u16(), q) {
                    (200, Some(q)) if q == old_q => old_ok.fetch_add(1, Ordering::AcqRel),
                    (200, Some(q)) if q == new_q => new_ok.fetch_add(1, Ordering::AcqRel),
                    (429, _) if after => refused_after.fetch_add(1, Ordering::AcqRel),
                    (429, _) => 0,
                    other => panic!("unexpected answer {other:?}"),
                };
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while old_ok.load(Ordering::Acquire) < 300 {
        assert!(Instant::now() < deadline, "the load never reached 300");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let reloading = layer.clone();
    tokio::task::spawn_blocking(move || reloading.reload([rule(to, QuotaChange::Proportional)]))
        .await
        .unwrap()
        .unwrap();
    reloaded.store(true, Ordering::Release);
    for c in clients {
        c.await.unwrap();
    }
    assert!(
        refused_after.load(Ordering::Acquire) >= 200,
        "the new rules refused"
    );
    (
        old_ok.load(Ordering::Acquire),
        new_ok.load(Ordering::Acquire),
    )
}

/// The old rules decide while a reload compiles (it converts 20,000 other
/// keys too): every request they admitted counts under the new quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_counts_what_the_old_rules_decided_meanwhile() {
    let day = std::time::Duration::from_secs(86_400);
    // Rolling: 1,000 a day is one unit back every 86.4 s, none in this test.
    let (old, new) = reload_under_load(Quota::new(1_000, day), Quota::new(500, day)).await;
    let allowed = 500.0 - old as f64 / 2.0;
    assert!(
        (new as f64) <= allowed.ceil() && (new as f64) >= allowed.floor() - 1.0,
        "rolling: {old} old admissions leave {allowed}, the new rules admitted {new}"
    );
    // Calendar: the count converts rounded up.
    let (old, new) =
        reload_under_load(Quota::per_calendar_day(1_000), Quota::per_calendar_day(500)).await;
    assert_eq!(new, 500 - old.div_ceil(2), "calendar: {old} old admissions");
}

/// Requests waiting out a deny (`OnDeny::Wait`) when a reload lands ask
/// again on the rules they started with: their store sends them to its
/// successor, so they share the new quota's refill instead of the old
/// one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_through_a_reload_are_decided_in_the_new_store() {
    use keyed_rate_limit::rule::OnDeny;
    use std::time::Duration;
    let waiting = |q| {
        rule(q, QuotaChange::Proportional).on_deny(OnDeny::Wait {
            max: Duration::from_secs(3),
            queue: 8,
        })
    };
    // One unit back every 500 ms before the reload, every second after.
    let (old, new) = (
        Quota::new(4, Duration::from_secs(2)),
        Quota::new(2, Duration::from_secs(2)),
    );
    let layer = RateLimitLayer::builder()
        .rule(waiting(old))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..4 {
        assert_eq!(get(&url).await.status(), 200);
    }
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { get(&url).await.status().as_u16() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    layer.reload([waiting(new)]).unwrap();
    let mut admitted = 0;
    for w in waiters {
        admitted += u32::from(w.await.unwrap() == 200);
    }
    // Within their 3 s: about 3 units of the new refill, not 6 of the old.
    assert!((1..=4).contains(&admitted), "{admitted} waiters admitted");
}
