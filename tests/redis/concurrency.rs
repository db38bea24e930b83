//! The concurrency limiter on Redis slots: separate gateways (axum
//! servers) sharing one real `redis-server`, which the tests also kill.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::Backend as _;
use axum::Router;
use axum::extract::State;
use axum::routing;
use keyed_rate_limit::KeyExtractor;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{ConcurrencyLimitLayer, concurrency::ConcurrencyLimitBuilder};
use keyed_rate_limit_testing::RedisServer;
use reqwest::StatusCode;
use tokio::sync::{mpsc, oneshot};

/// Generous: a loaded 2-core CI box must not turn a healthy Redis into a failure.
const HEALTHY_TIMEOUT: Duration = Duration::from_millis(500);

/// The slot set of account `acct` under the limit `exports`.
fn slot_key(prefix: &str, acct: &str) -> String {
    format!("{prefix}:{{7:exports:{acct}}}:lease")
}

fn builder(max_in_flight: u32) -> ConcurrencyLimitBuilder {
    ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), max_in_flight)
        .redis_timeout(HEALTHY_TIMEOUT)
}

async fn redis(server: &RedisServer, prefix: &str) -> RedisBackend {
    server.backend(prefix).await
}

/// One gateway: `/slow` waits for the test's switch, `/fast` answers at once.
struct Gateway {
    addr: SocketAddr,
    /// Each `/slow` request sends the switch that lets it finish.
    entered: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
}

async fn slow(State(entered): State<mpsc::UnboundedSender<oneshot::Sender<()>>>) -> &'static str {
    let (tx, rx) = oneshot::channel();
    entered.send(tx).unwrap();
    let _ = rx.await;
    "done"
}

async fn gateway(layer: ConcurrencyLimitLayer) -> Gateway {
    let (tx, entered) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/slow", routing::get(slow))
        .route("/fast", routing::get(|| async { "fast" }))
        .layer(layer)
        .with_state(tx);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Gateway { addr, entered }
}

async fn get(addr: SocketAddr, path: &str, acct: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}{path}"))
        .header("x-account", acct)
        .send()
        .await
        .unwrap()
}

/// Sends a `/slow` request in the background; its status arrives when it ends.
fn spawn_slow(addr: SocketAddr, acct: &'static str) -> tokio::task::JoinHandle<StatusCode> {
    tokio::spawn(async move { get(addr, "/slow", acct).await.status() })
}

fn zcard(server: &RedisServer, key: &str) -> u32 {
    let mut c = server.connection().unwrap();
    redis::cmd("ZCARD").arg(key).query(&mut c).unwrap()
}

/// Waits (bounded) until the slot set holds `n` slots: releases are
/// fire-and-forget, and expiry takes the TTL.
async fn wait_slots(server: &RedisServer, key: &str, n: u32) {
    for _ in 0..500 {
        if zcard(server, key) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} holds {} slots, expected {n}", zcard(server, key));
}

#[tokio::test]
async fn two_gateways_sharing_redis_admit_at_most_n_in_total() {
    let server = RedisServer::start();
    let mut a = gateway(
        builder(2)
            .global(redis(&server, "t1").await)
            .build()
            .unwrap(),
    )
    .await;
    let mut b = gateway(
        builder(2)
            .global(redis(&server, "t1").await)
            .build()
            .unwrap(),
    )
    .await;
    let key = slot_key("t1", "acme");

    // Six concurrent requests over both gateways: two enter, four are
    // refused (an admitted request cannot end before its switch is sent).
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for i in 0..6 {
        let (addr, done) = (if i % 2 == 0 { a.addr } else { b.addr }, done_tx.clone());
        tokio::spawn(async move { done.send(get(addr, "/slow", "acme").await.status()) });
    }
    for _ in 0..4 {
        assert_eq!(done.recv().await.unwrap(), StatusCode::TOO_MANY_REQUESTS);
    }
    let mut switches = Vec::new();
    while switches.len() < 2 {
        tokio::select! {
            Some(s) = a.entered.recv() => switches.push(s),
            Some(s) = b.entered.recv() => switches.push(s),
        }
    }
    assert!(a.entered.try_recv().is_err() && b.entered.try_recv().is_err());
    assert_eq!(switches.len(), 2, "two gateways together admit two");
    assert_eq!(zcard(&server, &key), 2);

    let res = get(b.addr, "/fast", "acme").await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry <= 1, "the configured hint (1 s) bounds Retry-After");
    // Another account has its own slots.
    assert_eq!(
        get(a.addr, "/fast", "globex").await.status(),
        StatusCode::OK
    );

    // Completing one request frees its slot for either gateway.
    switches.pop().unwrap().send(()).unwrap();
    wait_slots(&server, &key, 1).await;
    let admitted = get(b.addr, "/fast", "acme").await;
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(admitted.text().await.unwrap(), "fast");
    wait_slots(&server, &key, 1).await;

    switches.pop().unwrap().send(()).unwrap();
    wait_slots(&server, &key, 0).await;
}

#[tokio::test]
async fn a_client_that_gives_up_frees_its_slot() {
    let server = RedisServer::start();
    let layer = builder(1)
        .global(redis(&server, "t2").await)
        .build()
        .unwrap();
    let mut g = gateway(layer.clone()).await;
    let key = slot_key("t2", "acme");

    let client = spawn_slow(g.addr, "acme");
    let _switch = g.entered.recv().await.unwrap();
    assert_eq!(zcard(&server, &key), 1);
    assert_eq!(layer.in_flight(&keyed_rate_limit::Key::from("acme")), 1);
    let refused = get(g.addr, "/fast", "acme").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // The connection closes; the server drops the handler and the permit.
    client.abort();
    wait_slots(&server, &key, 0).await;
    assert_eq!(layer.in_flight(&keyed_rate_limit::Key::from("acme")), 0);
    assert_eq!(get(g.addr, "/fast", "acme").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_crashed_gateways_slots_expire_after_the_ttl() {
    let server = RedisServer::start();
    let key = slot_key("t3", "acme");
    // A gateway that crashed holding both slots: slots taken through the
    // script itself, never released.
    let slot = redis::Script::new(concat!(
        include_str!("../../src/backend/redis/lua/clock.lua"),
        include_str!("../../src/backend/redis/lua/slot.lua")
    ));
    let mut c = server.connection().unwrap();
    for id in ["crashed-1", "crashed-2"] {
        let (ok, _, _): (i64, i64, i64) = slot
            .key(&key)
            .arg("acquire")
            .arg(id)
            .arg(2)
            .arg(300)
            .arg(1000)
            .invoke(&mut c)
            .unwrap();
        assert_eq!(ok, 1);
    }

    let layer = builder(2)
        .global(redis(&server, "t3").await)
        .slot_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    let g = gateway(layer).await;
    let refused = get(g.addr, "/fast", "acme").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["retry-after"],
        "1",
        "the earliest slot expires within the TTL"
    );

    wait_slots(&server, &key, 0).await;
    assert_eq!(get(g.addr, "/fast", "acme").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_dropped_gateway_without_release_frees_after_the_ttl() {
    let server = RedisServer::start();
    let key = slot_key("t4", "acme");
    let ttl = Duration::from_secs(1);
    // A slot taken by a permit on a runtime that then dies: no release and
    // no renewal can run, as when a gateway crashes.
    let url = server.url();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let redis = RedisBackend::builder(url)
                .prefix("t4")
                .build()
                .await
                .unwrap();
            let layer = builder(1).global(redis).slot_ttl(ttl).build().unwrap();
            let g = gateway(layer).await;
            tokio::spawn(get(g.addr, "/slow", "acme"));
            let mut entered = g.entered;
            std::mem::forget(entered.recv().await.unwrap());
        });
        // Dropping the runtime cancels every task; the permit's release
        // finds no runtime to run on.
        drop(rt);
    })
    .join()
    .unwrap();
    assert_eq!(zcard(&server, &key), 1, "the slot outlives its gateway");

    let layer = builder(1)
        .global(redis(&server, "t4").await)
        .slot_ttl(ttl)
        .build()
        .unwrap();
    let g = gateway(layer).await;
    wait_slots(&server, &key, 0).await;
    assert_eq!(get(g.addr, "/fast", "acme").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_long_request_renews_its_slot() {
    let server = RedisServer::start();
    let key = slot_key("t5", "acme");
    let ttl = Duration::from_millis(900);
    let layer = builder(1)
        .global(redis(&server, "t5").await)
        .slot_ttl(ttl)
        .build()
        .unwrap();
    let mut g = gateway(layer).await;
    let slow = spawn_slow(g.addr, "acme");
    let switch = g.entered.recv().await.unwrap();

    // Well past the TTL the slot is still held, renewed every TTL/3.
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(zcard(&server, &key), 1);
    let refused = get(g.addr, "/fast", "acme").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    switch.send(()).unwrap();
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    wait_slots(&server, &key, 0).await;
}

#[tokio::test]
async fn a_dead_redis_takes_the_failure_mode() {
    let mut server = RedisServer::start();
    let closed = gateway(
        builder(1)
            .global(redis(&server, "t6").await)
            .on_redis_failure(FailureMode::FailClosed)
            .build()
            .unwrap(),
    )
    .await;
    let open = gateway(
        builder(1)
            .global(redis(&server, "t6").await)
            .on_redis_failure(FailureMode::FailOpen)
            .build()
            .unwrap(),
    )
    .await;
    assert_eq!(
        get(closed.addr, "/fast", "acme").await.status(),
        StatusCode::OK
    );
    server.kill();

    for _ in 0..3 {
        let res = get(closed.addr, "/fast", "acme").await;
        assert_eq!(
            res.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "fail_closed refuses"
        );
        assert!(res.headers().contains_key("retry-after"));
        assert_eq!(
            get(open.addr, "/fast", "acme").await.status(),
            StatusCode::OK,
            "fail_open admits"
        );
    }
}

/// With Redis killed, the local fallback holds one slot: a second request
/// is refused until the first completes.
async fn one_slot_while_redis_is_down(build: ConcurrencyLimitBuilder, prefix: &str) {
    let mut server = RedisServer::start();
    let layer = build.global(redis(&server, prefix).await).build().unwrap();
    let mut g = gateway(layer).await;
    server.kill();

    let slow = spawn_slow(g.addr, "acme");
    let switch = g.entered.recv().await.unwrap();
    let refused = get(g.addr, "/fast", "acme").await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    switch.send(()).unwrap();
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    assert_eq!(get(g.addr, "/fast", "acme").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn local_fallback_limits_each_instance_to_n() {
    one_slot_while_redis_is_down(builder(1), "t7").await;
}

#[tokio::test]
async fn local_fallback_enforces_the_instance_share() {
    // 4 in flight over 4 instances: each may hold 1 while Redis is down.
    one_slot_while_redis_is_down(builder(4).instances(4), "t9").await;
}

#[tokio::test]
async fn build_checks_global_settings() {
    let server = RedisServer::start();
    let r = redis(&server, "t8").await;
    let global = |name: &str| {
        ConcurrencyLimitLayer::builder(name, KeyExtractor::everyone(), 1).global(r.clone())
    };
    assert!(
        global("ex{ports}").build().is_err(),
        "braces break the hash tag"
    );
    assert!(
        global("exports")
            .slot_ttl(Duration::from_millis(1))
            .build()
            .is_err()
    );
    assert!(
        global("exports")
            .redis_timeout(Duration::ZERO)
            .build()
            .is_err()
    );
    assert!(
        global("exports")
            .slot_ttl(Duration::from_millis(10))
            .build()
            .is_ok()
    );
}

/// An acquire that times out may still run once Redis answers: its slot is
/// released then, not left ownerless until its TTL.
#[tokio::test]
async fn a_timed_out_acquire_leaves_no_slot_behind() {
    let server = RedisServer::start();
    let layer = builder(2)
        .global(redis(&server, "unanswered").await)
        .redis_timeout(Duration::from_millis(50))
        .slot_ttl(Duration::from_secs(60))
        .on_redis_failure(FailureMode::FailOpen)
        .instances(1)
        .build()
        .unwrap();
    let gw = gateway(layer).await;
    // Loads the script, so the queued EVALSHA below runs on resume.
    assert_eq!(get(gw.addr, "/fast", "warm").await.status(), StatusCode::OK);
    let calls = server.script_calls();
    server.pause(); // the acquire is sent and queued, unanswered
    let res = get(gw.addr, "/fast", "acme").await;
    assert_eq!(res.status(), StatusCode::OK, "failed open");
    server.resume(); // the queued acquire runs now, then the release
    let mut c = server.connection().unwrap();
    let key = slot_key("unanswered", "acme");
    // Bounded: the release follows the acquire on the same connection; a
    // slot that lingered would stay for its 60 s TTL.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let held: u32 = redis::cmd("ZCARD").arg(&key).query(&mut c).unwrap();
        if held == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{held} ownerless slot(s) left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The acquire did run after the resume, and so did its release.
    assert!(
        server.script_calls() >= calls + 2,
        "acquire and release both ran"
    );
}

/// 10,000 requests in flight on 100 keys: one renewal task for them all
/// (one Redis call per key each TTL/3), not one task per request. Their
/// slots outlive several TTLs, so the batched renewals work; the task ends
/// with the last slot. The requests arrive in ten waves of 1,000, as long
/// requests pile up: a single burst of 10,000 acquires queues past the
/// client's response timeout and takes the failure mode instead.
#[tokio::test]
async fn ten_thousand_requests_in_flight_share_one_renewal_task() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    let server = RedisServer::start();
    // Renewed every ttl/3: 3 s leaves slack for a debug build sharing two
    // cores with the other tests (at 1 s, 17 of 10,000 slots lapsed so,
    // and at 2 s some did beside a release build).
    let ttl = Duration::from_secs(3);
    let layer = builder(200)
        .global(redis(&server, "many").await)
        .slot_ttl(ttl)
        .build()
        .unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let (open, gate) = tokio::sync::watch::channel(false);
    let inner = {
        let entered = entered.clone();
        tower::service_fn(move |_req: http::Request<axum::body::Body>| {
            let mut gate = gate.clone();
            entered.fetch_add(1, Ordering::Relaxed);
            async move {
                let _ = gate.wait_for(|open| *open).await;
                Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
            }
        })
    };
    let svc = layer.layer(inner);
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut waves = Vec::new();
    for wave in 0..10 {
        let requests: Vec<_> = (0..1000)
            .map(|i| {
                let req = http::Request::builder()
                    .header("x-account", format!("acct-{}", i % 100))
                    .body(axum::body::Body::empty())
                    .unwrap();
                svc.clone().oneshot(req)
            })
            .collect();
        // One task drives a wave.
        waves.push(tokio::spawn(futures_util::future::join_all(requests)));
        while entered.load(Ordering::Relaxed) < (wave + 1) * 1000 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} entered",
                entered.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // Two TTLs later every slot is still held: the renewals work.
    tokio::time::sleep(ttl * 2).await;
    let held: u32 = (0..100)
        .map(|i| zcard(&server, &slot_key("many", &format!("acct-{i}"))))
        .sum();
    assert_eq!(held, 10_000);
    let during = metrics.num_alive_tasks();
    assert!(
        during <= before + 10 + 2,
        "{before} tasks before, {during} with 10,000 requests in flight (10 wave drivers)"
    );
    open.send(true).unwrap();
    for wave in waves {
        let statuses = wave.await.unwrap();
        assert!(statuses.iter().all(|r| r.as_ref().unwrap().status() == 200));
    }
    for i in 0..100 {
        wait_slots(&server, &slot_key("many", &format!("acct-{i}")), 0).await;
    }
    // The renewal task ends with the last slot (and the releases' tasks with them).
    while metrics.num_alive_tasks() > before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} tasks left",
            metrics.num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
