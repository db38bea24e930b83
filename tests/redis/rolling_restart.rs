//! A rolling restart: a fleet rolls out gateways started with a new quota
//! beside (then instead of) gateways on the old one, on one Redis. The
//! fleet's record of the quotas in play lets the new gateway convert the
//! state the old quota left, exactly as a reload would (ADR 33): after 8
//! of 10 spent, nobody gets a fresh quota, whoever decides first, on every
//! algorithm and in every `QuotaChange` mode.

use crate::rolling_reload::rule_with;
use crate::support::Backend as _;
use crate::support::{ALGORITHMS, get_with, ok_app, serve};
use keyed_rate_limit::rule::QuotaChange;
use keyed_rate_limit::{Algorithm, RateLimitLayer};
use keyed_rate_limit_testing::RedisServer;

/// A gateway process of its own: its own connection, its own layer.
async fn gateway(
    server: &RedisServer,
    prefix: &str,
    algorithm: Algorithm,
    per_hour: u32,
    how: QuotaChange,
) -> String {
    let redis = server.backend(prefix).await;
    let layer = RateLimitLayer::builder()
        .rule(rule_with(&redis, algorithm, per_hour, how))
        .build()
        .unwrap();
    serve(ok_app(layer)).await
}

/// Requests `key` from `url` until the first refusal (at most 40): how
/// many were admitted.
async fn drain(url: &str, key: &str) -> u32 {
    for n in 0..40 {
        if get_with(url, &[("x-api-key", key)]).await.status() != 200 {
            return n;
        }
    }
    panic!("40 admissions in a row");
}

/// Who drains the key after the new gateway starts.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// The new gateway first and last, the old one still serving between.
    NewFirst,
    /// The old gateway first, then the new one, then the old one again.
    OldFirst,
    /// The old gateway stopped: only the new one.
    OldStopped,
}

/// An old gateway spends 8 of 10 an hour; a gateway started with `to`
/// then joins. What the fleet admitted after the 8.
async fn admitted(
    server: &RedisServer,
    algorithm: Algorithm,
    how: QuotaChange,
    to: u32,
    order: Order,
) -> u32 {
    let prefix = format!("restart-{algorithm}-{how:?}-{to}-{order:?}");
    let old = gateway(server, &prefix, algorithm, 10, how).await;
    for _ in 0..8 {
        assert_eq!(get_with(&old, &[("x-api-key", "k")]).await.status(), 200);
    }
    let new = gateway(server, &prefix, algorithm, to, how).await;
    match order {
        Order::NewFirst => drain(&new, "k").await + drain(&old, "k").await + drain(&new, "k").await,
        Order::OldFirst => drain(&old, "k").await + drain(&new, "k").await + drain(&old, "k").await,
        Order::OldStopped => drain(&new, "k").await,
    }
}

#[tokio::test]
async fn a_rolling_restart_hands_nobody_a_fresh_quota() {
    let server = RedisServer::start();
    for algorithm in ALGORITHMS {
        for order in [Order::NewFirst, Order::OldFirst, Order::OldStopped] {
            let case = |how, to| format!("{algorithm}, {how:?} to {to}, {order:?}");
            // Proportional: 8 of 10 used is 4 of 5 (1 left) or 16 of 20 (4
            // left); the old rules leave 2 either way.
            let how = QuotaChange::Proportional;
            let low = admitted(&server, algorithm, how, 5, order).await;
            assert!((1..=2).contains(&low), "{}: {low}", case(how, 5));
            let high = admitted(&server, algorithm, how, 20, order).await;
            assert!((2..=4).contains(&high), "{}: {high}", case(how, 20));
            // As is: 8 used stays 8 (capped at 5): nothing left under 5,
            // or what the old rules left, 12 under 20.
            let how = QuotaChange::AsIs;
            let low = admitted(&server, algorithm, how, 5, order).await;
            assert!(low <= 2, "{}: {low}", case(how, 5));
            let high = admitted(&server, algorithm, how, 20, order).await;
            assert!((10..=12).contains(&high), "{}: {high}", case(how, 20));
            // Reset asks for a fresh quota under the new rules, beside the
            // old rules' state, as a reload's does.
            let how = QuotaChange::Reset;
            let fresh = match order {
                Order::OldStopped => 0,
                _ => 2,
            };
            let low = admitted(&server, algorithm, how, 5, order).await;
            assert_eq!(low, 5 + fresh, "{}", case(how, 5));
        }
    }
}
