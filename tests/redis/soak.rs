//! A chaos soak: four gateways
//! on one private Redis, on a private 3-master cluster, and through Redis
//! Sentinel, under a fixed
//! offered rate, a fault every two seconds. Asserts what holds on any machine: no 5xx or failed request,
//! no over-admission while Redis is healthy, failure-mode decisions only
//! around faults, recovery within 2 s, no leaked tasks.

use std::time::Duration;

use crate::support::soak::{Config, Topology, run};

/// The soaks read RSS and tasks: each runs in a process of its own, two at
/// a time (latency is reported, not judged; the long run's figures come
/// from one soak at a time, `SOAK_SECS=60 … soak::<name>`).
static TWO_AT_A_TIME: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Set in the process a soak runs in.
const CHILD: &str = "KRL_SOAK_CHILD";

/// Runs test `name` in a process of its own: the soak reads the process's
/// RSS and tasks, which the other tests of this binary would move. True in that process (run the soak); false in the test that
/// started it, once the child passed.
async fn alone(name: &str) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let _two_at_a_time = TWO_AT_A_TIME.acquire().await.expect("never closed");
    let exe = std::env::current_exe().expect("the test binary");
    let status = tokio::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .status()
        .await
        .expect("start the soak's own process");
    assert!(status.success(), "{name} failed in its own process");
    false
}

/// 12 s (Sentinel: 9 s, enough for its failover and a sentinel restart)
/// at 300 requests/s, a fault every 2 s (or `SOAK_SECS`, `SOAK_RATE`,
/// `SOAK_FAULT_EVERY` for the long run: `SOAK_SECS=120 cargo test --release
/// --all-features --test redis soak -- --nocapture`): the report, checked
/// for every violation.
async fn soak(topology: Topology, default_secs: u64) -> crate::support::soak::Report {
    let (secs, rate) = (env("SOAK_SECS", default_secs), env("SOAK_RATE", 300));
    let report = run(Config {
        duration: Duration::from_secs(secs),
        rate: u32::try_from(rate).expect("SOAK_RATE fits a u32"),
        fault_every: Duration::from_secs(env("SOAK_FAULT_EVERY", 2)),
        keys: 200,
        topology,
    })
    .await;
    report.print();
    // Five sixths of what was offered were served (3,000 of 3,600 by default).
    let offered = usize::try_from(secs * rate).expect("fits");
    assert!(report.requests > offered * 5 / 6, "{}", report.requests);
    assert_eq!(report.violations(), Vec::<String>::new());
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_survive_every_fault_exactly() {
    if !alone("soak::four_gateways_survive_every_fault_exactly").await {
        return;
    }
    let report = soak(Topology::Single, 12).await;
    assert!(report.faults.len() >= 4, "every kind of fault ran");
}

/// The same on a 3-master cluster with a replica each, where one fault is a
/// master failover: the master dies and its replica takes over.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_survive_a_cluster_failover_exactly() {
    if !alone("soak::four_gateways_survive_a_cluster_failover_exactly").await {
        return;
    }
    let report = soak(Topology::Cluster, 12).await;
    assert!(report.faults.iter().any(|f| f.0 == "failover"));
}

/// The same through Redis Sentinel: a master killed until the replica is
/// promoted (the old master then restarts and is demoted), and a sentinel
/// killed and restarted, beside the script and connection faults.
#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_follow_a_sentinel_failover_exactly() {
    if !alone("soak::four_gateways_follow_a_sentinel_failover_exactly").await {
        return;
    }
    let report = soak(Topology::Sentinel, 9).await;
    assert!(report.faults.iter().any(|f| f.0 == "failover"));
    assert!(report.faults.iter().any(|f| f.0 == "sentinel_restart"));
}
