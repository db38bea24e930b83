//! tower contracts: `poll_ready`/`call` with a readiness-sensitive inner
//! service, `ServiceBuilder` composition and `Clone`.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use keyed_rate_limit::{
    Key, KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision,
};
use tower::{Service, ServiceBuilder, ServiceExt};

async fn echo_remaining(req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let d = req
        .extensions()
        .get::<RateLimitDecision>()
        .cloned()
        .unwrap_or_default();
    let left = d
        .rules()
        .first()
        .map_or(u32::MAX, |r| r.decision.remaining());
    Ok(Response::new(Full::new(Bytes::from(left.to_string()))))
}

fn layer(async_key: bool) -> RateLimitLayer {
    let key = if async_key {
        KeyExtractor::new_async("async-global", |_| async { Some(Key::from("*")) })
    } else {
        KeyExtractor::everyone()
    };
    RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("r", key, Quota::per_minute(3)))
        .build()
        .unwrap()
}

#[tokio::test]
async fn readied_inner_is_the_one_called_on_both_paths() {
    for async_key in [false, true] {
        // ConcurrencyLimit panics if `call` reaches a clone that was never readied.
        let svc = ServiceBuilder::new()
            .layer(layer(async_key))
            .concurrency_limit(1)
            .service_fn(echo_remaining);
        let mut a = svc.clone();
        let mut b = svc;
        let mut bodies = Vec::new();
        for i in 0..4 {
            let s = if i % 2 == 0 { &mut a } else { &mut b };
            let res = s
                .ready()
                .await
                .unwrap()
                .call(Request::new(Full::default()))
                .await
                .unwrap();
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            bodies.push((status, String::from_utf8(body.to_vec()).unwrap()));
        }
        assert_eq!(bodies[0], (200, "2".into()), "async={async_key}");
        assert_eq!(bodies[1], (200, "1".into()));
        assert_eq!(bodies[2], (200, "0".into()));
        assert_eq!(bodies[3].0, 429);
    }
}

#[tokio::test]
async fn a_deny_never_reaches_the_inner_service() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    let svc =
        ServiceBuilder::new()
            .layer(layer(true))
            .service_fn(move |_req: Request<Full<Bytes>>| {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { Ok::<_, Infallible>(Response::new(Full::<Bytes>::default())) }
            });
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let res = svc
            .clone()
            .oneshot(Request::new(Full::default()))
            .await
            .unwrap();
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn decision_extension_can_be_turned_off_and_headers_stay() {
    for on in [true, false] {
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(Rule::new(
                "r",
                KeyExtractor::everyone(),
                Quota::per_minute(3),
            ))
            .decision_extension(on)
            .build()
            .unwrap();
        let svc =
            ServiceBuilder::new()
                .layer(layer)
                .service_fn(|req: Request<Full<Bytes>>| async move {
                    let seen = req.extensions().get::<RateLimitDecision>().is_some();
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(seen.to_string()))))
                });
        let res = svc.oneshot(Request::new(Full::default())).await.unwrap();
        assert_eq!(res.headers()["ratelimit"], r#""r";r=2;t=20"#, "on={on}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, on.to_string());
    }
}

#[tokio::test]
async fn stacked_layers_report_every_rule_in_order() {
    let rule = |name: &str| {
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(Rule::new(
                name,
                KeyExtractor::everyone(),
                Quota::per_minute(3),
            ))
            .build()
            .unwrap()
    };
    let svc = ServiceBuilder::new()
        .layer(rule("outer"))
        .layer(rule("inner"))
        .service_fn(|req: Request<Full<Bytes>>| async move {
            let d = req.extensions().get::<RateLimitDecision>().unwrap();
            let names: Vec<_> = d.rules().iter().map(|r| r.rule.to_string()).collect();
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(names.join(",")))))
        });
    let res = svc.oneshot(Request::new(Full::default())).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "outer,inner");
}
