//! Request-time costs at and past the edges, over HTTP, on a local rule
//! (Redis and its failure modes: tests/redis/cost.rs). An unchecked cost
//! used to overflow inside governor: a panic here in debug builds, a
//! silent admit in release ones.

use crate::support::cost::{app, edges, rule};

#[tokio::test]
async fn local_rules_refuse_costs_past_the_burst() {
    edges(&app(rule()).await, "local").await;
}
