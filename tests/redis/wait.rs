//! `OnDeny::Wait` on a global rule: requests over the quota wait for their
//! unit on Redis time, over HTTP.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::wait::{admitted_at_their_slots, ten_per_second};
use keyed_rate_limit::{KeyExtractor, Rule};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_requests_over_the_quota_are_admitted_at_their_slots() {
    let server = keyed_rate_limit_testing::RedisServer::start();
    let rule = Rule::new("jobs", KeyExtractor::everyone(), ten_per_second())
        .global(server.backend("wait").await)
        .redis_timeout(Duration::from_millis(500));
    admitted_at_their_slots(rule).await;
}
