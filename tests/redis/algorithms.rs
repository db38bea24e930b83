//! The Redis backend against real `redis-server` processes.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyed_rate_limit::{Algorithm, Key, Quota, decision::Decision};
use keyed_rate_limit::{
    RedisBackend,
    backend::redis::{ConnectionMode, RedisBackendError},
};
use keyed_rate_limit_testing::RedisServer;

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];
const POOL: ConnectionMode = ConnectionMode::Pool { max_size: 8 };

async fn backend(server: &RedisServer, prefix: &str, mode: ConnectionMode) -> RedisBackend {
    RedisBackend::builder(server.url())
        .prefix(prefix)
        .connection(mode)
        .build()
        .await
        .expect("build")
}

async fn fire(b: &RedisBackend, algo: Algorithm, q: &Quota, n: usize) -> Vec<Decision> {
    let key = Key::from("k");
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(b.check("r", &key, algo, q, 1).await.expect("check"));
    }
    out
}

fn admitted(ds: &[Decision]) -> usize {
    ds.iter().filter(|d| d.is_allowed()).count()
}

#[tokio::test]
async fn exact_admit_counts_and_headers() {
    let server = RedisServer::start();
    let q = Quota::per_minute(10).with_burst(5);
    for (i, mode) in [ConnectionMode::Multiplexed, POOL].into_iter().enumerate() {
        for algo in ALL {
            let b = backend(&server, &format!("admit-{algo}-{i}"), mode).await;
            let ds = fire(&b, algo, &q, 30).await;
            let n = if algo.has_burst() { 5 } else { 10 };
            assert_eq!(admitted(&ds), n, "{algo} {mode:?}");
            // Admits come first, then every check is denied.
            assert!(ds[..n].iter().all(Decision::is_allowed), "{algo}");
            let remaining: Vec<u32> = ds[..n].iter().map(Decision::remaining).collect();
            let expected: Vec<u32> = (0..n as u32).rev().collect();
            assert_eq!(remaining, expected, "{algo}");
            for d in &ds[n..] {
                assert_eq!(d.remaining(), 0);
                let retry = d.retry_after().expect("deny has retry_after");
                // The real wait: one emission interval (6 s) for the burst
                // algorithms, the rest of the window for fixed window; the
                // sliding window waits for the end of its aligned window, then
                // for a tenth of the next one to decay.
                let (lo, hi) = match algo {
                    Algorithm::Gcra | Algorithm::TokenBucket => (5_000, 6_000),
                    Algorithm::FixedWindow => (59_000, 60_000),
                    _ => (6_000, 66_000),
                };
                let ms = retry.as_millis();
                assert!((lo..=hi).contains(&ms), "{algo} retry {ms}");
            }
            let first = ds[0];
            let reset = first.reset().as_millis();
            match algo {
                // One unit spent of a fresh bucket: back after exactly one interval.
                Algorithm::Gcra | Algorithm::TokenBucket => assert_eq!(reset, 6_000, "{algo}"),
                Algorithm::FixedWindow => assert_eq!(reset, 60_000),
                _ => assert!((60_000..=120_000).contains(&reset)),
            }
            assert_eq!(
                (first.limit(), first.window()),
                (10, Duration::from_secs(60))
            );
        }
    }
}

#[tokio::test]
async fn default_burst_is_the_limit() {
    let server = RedisServer::start();
    let b = backend(&server, "default-burst", ConnectionMode::Multiplexed).await;
    for algo in ALL {
        let ds = fire(&b, algo, &Quota::per_minute(10), 30).await;
        assert_eq!(admitted(&ds), 10, "{algo}");
    }
}

#[tokio::test]
async fn cost_weighting_and_never() {
    let server = RedisServer::start();
    let b = backend(&server, "cost", ConnectionMode::Multiplexed).await;
    let q = Quota::per_hour(10);
    for algo in ALL {
        let key = Key::from(format!("cost-{algo}"));
        let mut remaining = Vec::new();
        for _ in 0..4 {
            let d = b.check("r", &key, algo, &q, 3).await.unwrap();
            if d.is_allowed() {
                remaining.push(d.remaining());
            } else {
                assert!(d.retry_after().unwrap() > Duration::ZERO);
            }
        }
        assert_eq!(remaining, [7, 4, 1], "{algo}");
        // A denied cost of 3 consumed nothing: 1 unit is still there.
        let d = b.check("r", &key, algo, &q, 1).await.unwrap();
        assert!(d.is_allowed(), "{algo}");
        assert_eq!(d.remaining(), 0);

        let d = b
            .check("r", &Key::from("never"), algo, &q, 11)
            .await
            .unwrap();
        assert_eq!(
            (d.is_allowed(), d.limit(), d.remaining(), d.retry_after()),
            (false, 10, 0, None),
            "never: waiting would not help"
        );
    }
    // Above the burst is never for burst algorithms even when under the limit.
    let small = Quota::per_hour(10).with_burst(2);
    let d = b
        .check("r", &Key::from("b"), Algorithm::Gcra, &small, 3)
        .await
        .unwrap();
    assert_eq!(d.retry_after(), None);
    assert!(!d.is_allowed());
    // "never" decisions did not reach Redis.
    assert!(server.keys("cost:{r:never}*").is_empty());
    assert!(server.keys("cost:{r:b}*").is_empty());
}

#[tokio::test]
async fn retry_after_is_the_real_wait() {
    let server = RedisServer::start();
    let b = backend(&server, "retry", ConnectionMode::Multiplexed).await;
    let q = Quota::per_second(4);
    for algo in ALL {
        let key = Key::from(format!("retry-{algo}"));
        loop {
            let d = b.check("r", &key, algo, &q, 2).await.unwrap();
            if let Some(wait) = d.retry_after() {
                tokio::time::sleep(wait + Duration::from_millis(5)).await;
                break;
            }
        }
        let d = b.check("r", &key, algo, &q, 2).await.unwrap();
        assert!(d.is_allowed(), "{algo}: {d:?}");
    }
}

#[tokio::test]
async fn sliding_window_weights_the_previous_window() {
    let server = RedisServer::start();
    let b = backend(&server, "sliding", ConnectionMode::Multiplexed).await;
    let q = Quota::per_second(10);
    let key = Key::from("s");
    let check = || b.check("r", &key, Algorithm::SlidingWindow, &q, 1);
    // Fill one window, then wait for the next: the previous window's 10 still
    // count almost fully, so the estimate admits far fewer than 10 at once.
    while check().await.unwrap().is_allowed() {}
    let denied = check().await.unwrap();
    let wait = denied.retry_after().unwrap();
    tokio::time::sleep(wait + Duration::from_millis(5)).await;
    let mut n = 0;
    while check().await.unwrap().is_allowed() {
        n += 1;
    }
    assert!((1..10).contains(&n), "admitted {n}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_backends_share_one_limit() {
    let server = RedisServer::start();
    let q = Quota::per_hour(50);
    for algo in ALL {
        let prefix = format!("conc-{algo}");
        let mut backends = Vec::new();
        for mode in [
            ConnectionMode::Multiplexed,
            POOL,
            ConnectionMode::Multiplexed,
            POOL,
        ] {
            backends.push(backend(&server, &prefix, mode).await);
        }
        let mut tasks = Vec::new();
        for b in &backends {
            for _ in 0..50 {
                let b = b.clone();
                tasks.push(tokio::spawn(async move {
                    b.check("r", &Key::from("shared"), algo, &q, 1)
                        .await
                        .unwrap()
                }));
            }
        }
        let mut allowed = 0;
        for t in tasks {
            allowed += usize::from(t.await.unwrap().is_allowed());
        }
        assert_eq!(allowed, 50, "{algo}");
    }
}

/// `SCRIPT FLUSH` every 2 ms lands between some reloads and their retries:
/// the backend reloads again rather than failing the decision.
#[tokio::test]
async fn scripts_reload_while_flushed_in_a_loop() {
    let server = RedisServer::start();
    let b = backend(&server, "flushing", ConnectionMode::Multiplexed).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (stop, mut conn) = (stop.clone(), server.connection().unwrap());
        std::thread::spawn(move || {
            let mut flushes = 0u32;
            // Bounded: stops when told, or after 10 s of flushing.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && flushes < 5_000 {
                redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query::<()>(&mut conn)
                    .unwrap();
                flushes += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            flushes
        })
    };
    let q = Quota::per_hour(1_000_000);
    let mut failed = Vec::new();
    for i in 0..600u32 {
        let algo = ALL[i as usize % ALL.len()];
        if let Err(e) = b.check("f", &Key::from("k"), algo, &q, 1).await {
            failed.push(format!("{algo}: {e}"));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushes = flusher.join().unwrap();
    assert!(flushes > 10, "the flusher ran ({flushes} flushes)");
    assert!(
        failed.is_empty(),
        "{} of 600 failed: {failed:?}",
        failed.len()
    );
}

#[tokio::test]
async fn scripts_reload_after_flush_and_restart() {
    let mut server = RedisServer::start();
    let q = Quota::per_hour(5);
    let key = Key::from("restart");
    let multiplexed = backend(&server, "restart", ConnectionMode::Multiplexed).await;
    let pool = backend(&server, "restart", POOL).await;
    for b in [&multiplexed, &pool] {
        for algo in ALL {
            b.check("r", &key, algo, &q, 1).await.unwrap();
        }
    }
    server.flush_scripts();
    for algo in ALL {
        // NOSCRIPT, reloaded transparently on the same call; both share the state.
        let d = multiplexed.check("r", &key, algo, &q, 1).await.unwrap();
        assert_eq!(d.remaining(), 2, "{algo}");
        let d = pool.check("r", &key, algo, &q, 1).await.unwrap();
        assert_eq!(d.remaining(), 1, "{algo}");
    }

    server.restart();
    for b in [&multiplexed, &pool] {
        // The dropped connection may fail one call while it reconnects.
        let mut d = None;
        for _ in 0..50 {
            match b.check("r", &key, Algorithm::Gcra, &q, 1).await {
                Ok(x) => {
                    d = Some(x);
                    break;
                }
                Err(RedisBackendError::Redis(_)) => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(d.expect("reconnected").is_allowed());
        for algo in ALL {
            // Empty data and no scripts; all state is fresh.
            let d = b
                .check("r", &Key::from(format!("{b:?}")), algo, &q, 1)
                .await;
            assert_eq!(d.unwrap().remaining(), 4, "{algo}");
        }
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn eviction_policy_warning() {
    let server = RedisServer::start();
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let b = backend(&server, "evict", ConnectionMode::Multiplexed).await;
    assert_eq!(
        b.eviction_policy_warning().await.as_deref(),
        Some("noeviction")
    );
    assert!(logs.0.lock().unwrap().is_empty());

    server.set_config("maxmemory-policy", "allkeys-lru");
    assert_eq!(
        b.eviction_policy_warning().await.as_deref(),
        Some("allkeys-lru")
    );
    // Building a backend only reads the policy: the rules built on it warn.
    let _ = backend(&server, "evict", POOL).await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("WARN").count(), 1, "{text}");
    assert!(text.contains("keyed_rate_limit"), "{text}");
    assert!(text.contains("maxmemory_policy=allkeys-lru"), "{text}");
}

#[tokio::test]
async fn config_disabled_is_tolerated() {
    let server = RedisServer::start_with(&["--rename-command", "CONFIG", ""]);
    let b = backend(&server, "noconfig", ConnectionMode::Multiplexed).await;
    assert_eq!(b.eviction_policy_warning().await, None);
    let (key, q) = (Key::from("k"), Quota::per_hour(1));
    let d = b.check("r", &key, Algorithm::Gcra, &q, 1).await;
    assert!(d.unwrap().is_allowed());
}

#[tokio::test]
async fn password_in_url() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    assert!(server.url().contains(":s3cret@"));
    for mode in [ConnectionMode::Multiplexed, POOL] {
        let b = backend(&server, "auth", mode).await;
        let (key, q) = (Key::from("k"), Quota::per_hour(2));
        let d = b.check("r", &key, Algorithm::TokenBucket, &q, 1).await;
        assert!(d.unwrap().is_allowed());
    }
    // A wrong password is a clear start-up error that never shows the password.
    for mode in [ConnectionMode::Multiplexed, POOL] {
        let wrong = format!("redis://:n0pe-secret@127.0.0.1:{}", server.port());
        let err = start_up_error(&wrong, mode).await;
        let (shown, debug) = (err.to_string(), format!("{err:?}"));
        assert!(
            !shown.contains("n0pe-secret") && !debug.contains("n0pe-secret"),
            "{debug}"
        );
        assert!(
            matches!(err, RedisBackendError::Auth(_)),
            "{mode:?}: {shown}"
        );
    }
}

/// Start-up errors name their cause: an ACL user who may not load scripts,
/// and a cluster URL that points at a plain Redis.
#[tokio::test]
async fn start_up_errors_name_their_cause() {
    let server = RedisServer::start_with(&[
        "--user",
        "app",
        "on",
        ">app-secret",
        "~*",
        "&*",
        "+@all",
        "-script",
        "-evalsha",
    ]);
    let url = format!("redis://app:app-secret@127.0.0.1:{}", server.port());
    for mode in [ConnectionMode::Multiplexed, POOL] {
        let err = start_up_error(&url, mode).await;
        assert!(
            matches!(err, RedisBackendError::Permission(_)),
            "{mode:?}: {err}"
        );
        assert!(!format!("{err} {err:?}").contains("app-secret"));
    }
    #[cfg(feature = "redis-cluster")]
    {
        let plain = RedisServer::start();
        let err = RedisBackend::cluster_builder([plain.url()])
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, RedisBackendError::NotCluster(_)), "{err}");
    }
}

/// What `build` says for `url` in `mode`.
async fn start_up_error(url: &str, mode: ConnectionMode) -> RedisBackendError {
    RedisBackend::builder(url)
        .connection(mode)
        .build()
        .await
        .unwrap_err()
}

/// Nothing listens: the error names the server tried (never its
/// password), and says its cause once.
#[tokio::test]
async fn an_unreachable_server_is_named_at_start_up() {
    let mut server = RedisServer::start();
    let port = server.port();
    server.kill();
    let url = format!("redis://:s3cret@127.0.0.1:{port}/0");
    for mode in [ConnectionMode::Multiplexed, POOL] {
        let err = start_up_error(&url, mode).await;
        let (shown, debug) = (err.to_string(), format!("{err:?}"));
        assert!(
            matches!(&err, RedisBackendError::Unreachable { servers, .. }
                if *servers == format!("redis://127.0.0.1:{port}/0")),
            "{mode:?}: {debug}"
        );
        assert!(
            shown.starts_with(&format!(
                "cannot connect to redis at redis://127.0.0.1:{port}/0: "
            )),
            "{shown}"
        );
        assert_eq!(
            debug, shown,
            "the cause is told once, not again as a source"
        );
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}

#[tokio::test]
async fn binary_and_long_keys() {
    let server = RedisServer::start();
    let b = backend(&server, "keys", ConnectionMode::Multiplexed).await;
    let q = Quota::per_hour(1);
    let binary = Key::from(vec![0xff, 0x00, b'}', b'{', 0xfe]);
    let other = Key::from(vec![0xff, 0x00, b'}', b'{', 0xfd]);
    let long_a = Key::from(format!("{}a", "x".repeat(1000)));
    let long_b = Key::from(format!("{}b", "x".repeat(1000)));
    for algo in ALL {
        for key in [&binary, &other, &long_a, &long_b] {
            assert!(b.check("r", key, algo, &q, 1).await.unwrap().is_allowed());
            assert!(!b.check("r", key, algo, &q, 1).await.unwrap().is_allowed());
        }
    }
    let stored = server.keys("keys:*");
    // A hashed key, and the quota the state is counted in.
    assert!(stored.iter().all(|k| k.len() < 120), "long keys are hashed");
    assert!(
        stored
            .iter()
            .any(|k| k.starts_with(b"keys:{1:r:\xff\x00}{\xfe}"))
    );
}

#[tokio::test]
async fn braces_are_rejected() {
    let server = RedisServer::start();
    let err = RedisBackend::builder(server.url())
        .prefix("a{b")
        .build()
        .await;
    assert!(matches!(
        err,
        Err(RedisBackendError::InvalidName { what: "prefix", .. })
    ));
    let b = backend(&server, "braces", ConnectionMode::Multiplexed).await;
    let err = b
        .check(
            "r}",
            &Key::from("k"),
            Algorithm::Gcra,
            &Quota::per_hour(1),
            1,
        )
        .await;
    assert!(matches!(
        err,
        Err(RedisBackendError::InvalidName { what: "rule", .. })
    ));
}

#[tokio::test]
async fn rediss_urls_use_tls() {
    // A plain-text server: the TLS handshake must fail cleanly (no panic from
    // a missing crypto provider), in both modes.
    let server = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    for mode in [ConnectionMode::Multiplexed, POOL] {
        let b = RedisBackend::builder(url.clone()).connection(mode).build();
        assert!(b.await.is_err(), "{mode:?}");
    }
}

#[tokio::test]
async fn paused_redis_answers_after_resume() {
    let server = RedisServer::start();
    let b = backend(&server, "pause", ConnectionMode::Multiplexed).await;
    let (key, q) = (Key::from("p"), Quota::per_hour(3));
    assert!(
        b.check("r", &key, Algorithm::Gcra, &q, 1)
            .await
            .unwrap()
            .is_allowed()
    );
    server.pause();
    // The caller's timeout is the only defence against a stalled Redis.
    let stalled = tokio::time::timeout(
        Duration::from_millis(100),
        b.check("r", &key, Algorithm::Gcra, &q, 1),
    );
    assert!(stalled.await.is_err());
    server.resume();
    let d = b.check("r", &key, Algorithm::Gcra, &q, 1).await.unwrap();
    // The abandoned call may or may not have run once Redis resumed.
    assert!(d.is_allowed() && d.remaining() <= 1);
}
