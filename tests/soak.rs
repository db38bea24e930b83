//! A short chaos soak (`examples/soak.rs` runs the long one): four gateways
//! on one private Redis under a fixed offered rate, a fault every two
//! seconds. Asserts what holds on any machine: no 5xx or failed request,
//! no over-admission while Redis is healthy, failure-mode decisions only
//! around faults, recovery within 2 s, no leaked tasks.

mod support;

use std::time::Duration;

use support::soak::{Config, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_survive_every_fault_exactly() {
    let report = run(Config {
        duration: Duration::from_secs(12),
        rate: 300,
        fault_every: Duration::from_secs(2),
        keys: 200,
    })
    .await;
    report.print();
    assert!(report.faults.len() >= 4, "every kind of fault ran");
    assert!(report.requests > 3000);
    assert_eq!(report.violations(), Vec::<String>::new());
}
