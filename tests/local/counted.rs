//! Every decision counted: `outcome="allow"` beside the denies, exact under
//! concurrent load, so that a rule's deny share can be computed.

use crate::support::load::spread;
use crate::support::metrics::{counter, snapshotter};
use crate::support::{ok_app, serve};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

const DECISIONS: &str = "rate_limit_decisions_total";

#[tokio::test]
async fn allowed_and_denied_add_up_to_every_request_per_rule() {
    snapshotter(); // installed before the layer resolves its counters
    let layer = RateLimitLayer::builder()
        // Never refuses: it sees every request, allowing 100 and
        // counting the rest as shadow denies.
        .rule(
            Rule::new(
                "counted-shadow",
                KeyExtractor::everyone(),
                Quota::per_hour(100),
            )
            .shadow(true),
        )
        .rule(Rule::new(
            "counted-wide",
            KeyExtractor::everyone(),
            Quota::per_hour(1_000_000),
        ))
        .rule(Rule::new(
            "counted-client",
            KeyExtractor::header("x-client"),
            Quota::per_hour(50),
        ))
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let (ok, denied) = spread(&url, 1000, 8).await;
    assert_eq!((ok, denied), (400, 600), "8 clients × 50 admitted");

    let allow = |rule| counter(DECISIONS, rule, "allow");
    assert_eq!(allow("counted-client"), ok);
    assert_eq!(counter(DECISIONS, "counted-client", "deny"), denied);
    assert_eq!(allow("counted-wide"), 1000);
    assert_eq!(counter(DECISIONS, "counted-wide", "deny"), 0);
    assert_eq!(allow("counted-shadow"), 100);
    assert_eq!(counter(DECISIONS, "counted-shadow", "shadow_deny"), 900);
    assert_eq!(counter(DECISIONS, "counted-shadow", "deny"), 0);
}

#[tokio::test]
async fn an_any_of_group_counts_each_member_it_asked() {
    snapshotter();
    let layer = RateLimitLayer::builder()
        .any_of(
            "counted-g",
            [
                Rule::new(
                    "counted-g1",
                    KeyExtractor::header("x-client"),
                    Quota::per_hour(1),
                ),
                Rule::new(
                    "counted-g2",
                    KeyExtractor::header("x-client"),
                    Quota::per_hour(2),
                ),
            ],
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let (ok, denied) = spread(&url, 40, 8).await;
    assert_eq!(
        (ok, denied),
        (24, 16),
        "each client: one from g1, two from g2"
    );
    // The second member is asked only when the first refuses.
    assert_eq!(counter(DECISIONS, "counted-g1", "allow"), 8);
    assert_eq!(counter(DECISIONS, "counted-g1", "deny"), 32);
    assert_eq!(counter(DECISIONS, "counted-g2", "allow"), 16);
    assert_eq!(counter(DECISIONS, "counted-g2", "deny"), 16);
}
