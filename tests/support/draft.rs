//! Reading the draft -10 RateLimit fields back with a real structured-field
//! parser: what tests/local/draft.rs and tests/redis/draft.rs share.

use std::time::Duration;

use crate::support::sf::{Member, member};
use crate::support::{client, header, serve};
use axum::{Router, routing::get};
use keyed_rate_limit::ConcurrencyLimitLayer;
use tokio::sync::oneshot;

pub const LIMIT: u32 = 5;

pub const WINDOW: Duration = Duration::from_secs(10);

/// One response as a client reads it.
#[derive(Debug)]
pub struct Seen {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub policy: Member,
    pub state: Member,
}

pub async fn seen(res: reqwest::Response, rule: &str) -> Seen {
    Seen {
        status: res.status().as_u16(),
        retry_after: header(&res, "retry-after").map(|v| v.parse().unwrap()),
        policy: member(&res, "ratelimit-policy", rule),
        state: member(&res, "ratelimit", rule),
    }
}

/// `LIMIT + 1` requests for one key: the quota, then a deny.
pub async fn exchange(url: &str, key: &str, rule: &str) -> Vec<Seen> {
    let c = client();
    let mut out = Vec::new();
    for _ in 0..=LIMIT {
        let res = c.get(url).header("x-api-key", key).send().await.unwrap();
        out.push(seen(res, rule).await);
    }
    out
}

/// What every algorithm must show: a constant policy, `r` counting down,
/// `t` within `t_max` on allows, and on the deny `t` equal to a
/// `Retry-After` that is never 0.
pub fn check(label: &str, seen: &[Seen], t_max: i64) {
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.policy.int("q"), Some(i64::from(LIMIT)), "{label} {s:?}");
        assert_eq!(s.policy.int("w"), Some(10), "{label} {s:?}");
        assert_eq!(
            s.policy, seen[0].policy,
            "{label}: RateLimit-Policy is constant"
        );
        let (r, t) = (s.state.int("r").unwrap(), s.state.int("t").unwrap());
        if i < LIMIT as usize {
            assert_eq!((s.status, s.retry_after), (200, None), "{label} {s:?}");
            assert_eq!(r, i64::from(LIMIT) - 1 - i as i64, "{label} {s:?}");
            assert!(
                (1..=t_max).contains(&t),
                "{label}: spent, so more comes in 1..={t_max} s: {s:?}"
            );
        } else {
            assert_eq!(s.status, 429, "{label} {s:?}");
            let retry = s.retry_after.expect("a deny says when to retry");
            assert!(retry >= 1, "{label}: never 0");
            assert_eq!(
                (r, t),
                (0, retry as i64),
                "{label}: t is the Retry-After on a 429"
            );
        }
    }
}

/// A concurrency limit of one, with the slot held by a request that waits.
pub async fn concurrency_deny(layer: ConcurrencyLimitLayer) {
    let (hold_tx, hold_rx) = oneshot::channel::<()>();
    let hold = std::sync::Arc::new(tokio::sync::Mutex::new(Some(hold_rx)));
    let app = Router::new()
        .route(
            "/hold",
            get(move || {
                let hold = hold.clone();
                async move {
                    if let Some(rx) = hold.lock().await.take() {
                        let _ = rx.await;
                    }
                    "held"
                }
            }),
        )
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    let held = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move {
            c.get(format!("{url}/hold"))
                .header("x-api-key", "k")
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    // Bounded: the held request takes its slot within a few tries.
    let mut refused = None;
    for _ in 0..1000 {
        let res = c
            .get(format!("{url}/"))
            .header("x-api-key", "k")
            .send()
            .await
            .unwrap();
        if res.status() == 429 {
            refused = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let refused = refused.expect("the second request is refused while the first is held");
    let retry: i64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    let state = member(&refused, "ratelimit", "exports");
    let policy = member(&refused, "ratelimit-policy", "exports");
    assert_eq!(policy.string("qu").as_deref(), Some("concurrent-requests"));
    assert!(retry >= 1);
    assert_eq!(
        (state.int("r"), state.int("t")),
        (Some(0), Some(retry)),
        "t is the Retry-After"
    );
    hold_tx.send(()).unwrap();
    assert_eq!(held.await.unwrap(), 200);
}
