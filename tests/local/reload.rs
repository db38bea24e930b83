//! Live reload: `RulesConfig::watch` on a real file, under load over HTTP,
//! and `RateLimitLayer::reload` keeping the counters of unchanged rules.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::events::{capture, with_message};
use crate::support::metrics::{counter_with, snapshotter};
use crate::support::{client, ok_app, serve, sf};
use keyed_rate_limit::rule::QuotaChange;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit::{Registry, RulesConfig, config::ConfigWatcher};

/// A fresh directory under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("krl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The quotas before and after the edit: far above what four clients send
/// in the test's few seconds, so no request is refused (a refusal by `a`
/// would leave `b` out of the headers).
const OLD: u32 = 1_000_000;
const NEW: u32 = 2_000_000;

/// Two rules whose quotas are both `q`: a response mixing two versions
/// would show two different `q`s.
fn rules(q: u32) -> String {
    format!(
        "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"{q}/min\"\n\n\
         [[rules]]\nname = \"b\"\nkey = \"header:x-user\"\nquota = \"{q}/min\"\n"
    )
}

/// Writes as editors do: a temporary file renamed over the old one.
fn save(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Polls until `done`, for at most `limit`; returns how long it took.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    start.elapsed()
}

/// Rule `b`'s quota as a response's `RateLimit-Policy` shows it.
async fn policy_q(url: &str) -> Option<i64> {
    let res = crate::support::get_with(url, &[("x-user", "u")]).await;
    assert_eq!(res.status(), 200);
    sf::member(&res, "ratelimit-policy", "b").int("q")
}

fn quota_of(layer: &RateLimitLayer, rule: usize) -> u32 {
    layer.rules()[rule].static_quota().unwrap().limit()
}

#[tokio::test]
async fn edits_apply_under_load_whole_and_broken_ones_change_nothing() {
    snapshotter();
    let (events, _guard) = capture();
    let dir = TempDir::new("watch");
    let path = dir.0.join("limits.toml");
    save(&path, &rules(OLD));
    let (layer, watcher): (RateLimitLayer, ConfigWatcher) =
        RulesConfig::watch(&path, Registry::new()).unwrap();
    let url = serve(ok_app(layer.clone())).await;

    // Load: four clients until told to stop (bounded by count and time).
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for c in 0..4 {
        let (url, stop) = (url.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let client = client();
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && seen.len() < 20_000
            {
                let res = client
                    .get(&url)
                    .header("x-user", format!("u{c}"))
                    .send()
                    .await
                    .unwrap();
                let status = res.status().as_u16();
                assert_eq!(status, 200, "no refusal under these quotas");
                let q = |rule| sf::member(&res, "ratelimit-policy", rule).int("q");
                seen.push((status, q("a"), q("b")));
            }
            seen
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A valid edit: every rule's quota changes at once.
    save(&path, &rules(NEW));
    let took = until(Duration::from_secs(5), || quota_of(&layer, 0) == NEW).await;
    assert!(
        took < Duration::from_secs(1),
        "the edit took {took:?} to apply"
    );
    assert_eq!(watcher.reloads(), 1);
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A broken edit: rejected, counted, logged with its place; nothing changes.
    let rejected = counter_with(
        "rate_limit_config_reloads_total",
        &[("outcome", "rejected")],
    );
    save(
        &path,
        &rules(NEW).replace(&format!("{NEW}/min\"\n\n"), "0/min\"\n\n"),
    );
    until(Duration::from_secs(5), || watcher.rejected() == 1).await;
    let err = watcher.last_error().unwrap();
    assert_eq!(err.line(), Some(4), "{err}");
    assert!(err.message().contains("the limit is zero"), "{err}");
    assert_eq!((quota_of(&layer, 0), quota_of(&layer, 1)), (NEW, NEW));
    assert_eq!(
        counter_with(
            "rate_limit_config_reloads_total",
            &[("outcome", "rejected")]
        ),
        rejected + 1
    );
    // Reverting the broken edit clears the error, with nothing to reload.
    save(&path, &rules(NEW));
    until(Duration::from_secs(5), || watcher.last_error().is_none()).await;
    assert_eq!((watcher.reloads(), watcher.rejected()), (1, 1));
    let logged = with_message(
        &events,
        "rate-limit rules file rejected; the running rules stay",
    );
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0]["line"], "4");
    tokio::time::sleep(Duration::from_millis(200)).await;

    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for l in load {
        all.extend(l.await.unwrap());
    }
    assert!(all.len() > 100, "only {} requests", all.len());
    assert!(
        all.iter().all(|&(s, ..)| s == 200),
        "every request succeeded"
    );
    // Each request saw one chain: both rules old, or both new.
    let (mut old, mut new) = (0, 0);
    for &(_, a, b) in &all {
        let (old_q, new_q) = (Some(i64::from(OLD)), Some(i64::from(NEW)));
        match (a, b) {
            (a, b) if a == old_q && b == old_q => old += 1,
            (a, b) if a == new_q && b == new_q => new += 1,
            other => panic!("a request saw {other:?}"),
        }
    }
    assert!(old > 0 && new > 0, "{old} old, {new} new");
}

#[tokio::test]
async fn unchanged_rules_keep_their_counters() {
    let rule = |name: &str, q| {
        Rule::new(
            name.to_owned(),
            KeyExtractor::everyone(),
            Quota::per_minute(q),
        )
    };
    let layer = RateLimitLayer::builder()
        .rule(rule("kept", 3))
        .rule(rule("changed", 3))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    }
    layer
        .reload([
            rule("kept", 3),
            rule("changed", 4).on_quota_change(QuotaChange::Reset),
            rule("new", 5),
        ])
        .unwrap();
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        sf::member(&res, "ratelimit", "kept").int("r"),
        Some(0),
        "two spent before the reload"
    );
    assert_eq!(
        sf::member(&res, "ratelimit", "changed").int("r"),
        Some(3),
        "a new quota starts whole under QuotaChange::Reset"
    );
    assert_eq!(sf::member(&res, "ratelimit", "new").int("r"), Some(4));
    assert_eq!(c.get(&url).send().await.unwrap().status(), 429);
    // A rejected reload leaves the running rules.
    let err = layer
        .reload([rule("kept", 3), rule("kept", 3)])
        .unwrap_err();
    assert!(err.to_string().contains("kept"), "{err}");
    assert_eq!(layer.rules().len(), 3);
}

/// `let (layer, _) = RulesConfig::watch(..)` keeps reloading: the watching
/// lasts as long as the layer, is logged when it starts and when it stops.
#[tokio::test]
async fn a_dropped_watcher_handle_keeps_reloading_until_the_layer_goes() {
    let (events, _guard) = capture();
    let dir = TempDir::new("watch-dropped");
    let path = dir.0.join("limits.toml");
    save(&path, &rules(100));
    let (layer, _) = RulesConfig::watch(&path, Registry::new()).unwrap();
    let started = with_message(&events, "watching the rate-limit rules file");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["path"], path.display().to_string());
    let url = serve(ok_app(layer)).await;
    let q = || policy_q(&url);
    assert_eq!(q().await, Some(100));
    save(&path, &rules(101));
    let deadline = Instant::now() + Duration::from_secs(5);
    while q().await != Some(101) {
        assert!(Instant::now() < deadline, "the edit never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(with_message(&events, "stopped watching the rate-limit rules file").is_empty());

    // A layer that is dropped ends its watching, and says so.
    let other = dir.0.join("other.toml");
    save(&other, &rules(5));
    let (layer, watcher) = RulesConfig::watch(&other, Registry::new()).unwrap();
    // Past the burst of subscribers the parallel tests set up as they
    // start: an event logged during it can miss this test's capture (the
    // watcher stops at once now, at the next event in its directory).
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(layer);
    let stopped = || with_message(&events, "stopped watching the rate-limit rules file");
    until(Duration::from_secs(5), || !stopped().is_empty()).await;
    assert_eq!(stopped()[0]["path"], other.display().to_string());
    assert_eq!(stopped()[0]["why"], "the layer was dropped");
    assert_eq!(watcher.reloads(), 0);
}

/// A mounted Kubernetes ConfigMap, exactly as the kubelet lays it out and
/// updates it: `limits.toml` → `..data/limits.toml`, `..data` →
/// `..<timestamp>`; an update writes a new timestamped directory, points
/// `..data_tmp` at it, renames that over `..data` (atomic), and removes
/// the old directory. The file's own name never appears in the events.
#[cfg(unix)]
#[tokio::test]
async fn a_configmap_update_is_applied() {
    use std::os::unix::fs::symlink;
    let dir = TempDir::new("configmap");
    let version = |stamp: &str, q: u32| {
        let d = dir.0.join(format!("..{stamp}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("limits.toml"), rules(q)).unwrap();
    };
    version("2026_12_06_04_00_00.1", 100);
    symlink("..2026_12_06_04_00_00.1", dir.0.join("..data")).unwrap();
    symlink("..data/limits.toml", dir.0.join("limits.toml")).unwrap();
    let path = dir.0.join("limits.toml");
    let (layer, watcher) = RulesConfig::watch(&path, Registry::new()).unwrap();
    let url = serve(ok_app(layer)).await;
    let q = || policy_q(&url);
    assert_eq!(q().await, Some(100));
    // The kubelet's atomic update.
    version("2026_12_06_04_05_00.2", 101);
    symlink("..2026_12_06_04_05_00.2", dir.0.join("..data_tmp")).unwrap();
    std::fs::rename(dir.0.join("..data_tmp"), dir.0.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.0.join("..2026_12_06_04_00_00.1")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while q().await != Some(101) {
        assert!(
            Instant::now() < deadline,
            "the ConfigMap update never applied"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((watcher.reloads(), watcher.rejected()), (1, 0));
    assert!(watcher.last_error().is_none());
}
