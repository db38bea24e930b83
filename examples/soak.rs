//! The chaos soak: four gateways on one private `redis-server` (started on
//! an ephemeral port; never the shared 6379), a fixed offered rate over 200
//! keys and a hot key, and a fault every few seconds: SIGKILL and restart,
//! SIGSTOP/SIGCONT, `SCRIPT FLUSH`, `CLIENT KILL` of the gateways'
//! connections. Prints requests served, faults, latency, and every
//! violation of: no 5xx, no over-admission while Redis is healthy,
//! failure-mode decisions only around faults, recovery within 2 s, no
//! leaked tasks.
//!
//! ```sh
//! cargo run --release --example soak --features redis
//! SOAK_SECS=120 SOAK_RATE=1000 cargo run --release --example soak --features redis
//! # a 3-master cluster with a replica each; one fault is a master failover
//! cargo run --release --example soak --features redis-cluster -- --cluster
//! ```

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let report = support::soak::run(support::soak::Config {
        duration: Duration::from_secs(env("SOAK_SECS", 60)),
        rate: env("SOAK_RATE", 800) as u32,
        fault_every: Duration::from_secs(env("SOAK_FAULT_EVERY", 3)),
        keys: 200,
        cluster: std::env::args().any(|a| a == "--cluster"),
    })
    .await;
    report.print();
    if !report.violations().is_empty() {
        std::process::exit(1);
    }
}
