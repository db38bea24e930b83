//! The layer over real HTTP: axum servers on ephemeral ports, a reqwest client.

use std::time::Duration;

use crate::support::{client, header, ok_app, serve, statuses};
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Extension, Router, routing::get};
use http::StatusCode;
use keyed_rate_limit::BuildError;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{
    Key, Quota, RateLimitLayer, Rule, decision::RateLimitDecision, headers::HeaderStyle,
};
use keyed_rate_limit::{KeyExtractor, key::TrustedProxies};

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/items/{id}", get(|| async { "item" }))
        .layer(layer)
}

fn one_rule(rule: Rule) -> RateLimitLayer {
    RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule)
        .build()
        .unwrap()
}

#[tokio::test]
async fn quickstart_rule_admits_five_then_429_with_headers() {
    let layer = one_rule(
        Rule::new(
            "per-key",
            KeyExtractor::header("x-api-key"),
            Quota::new(5, Duration::from_secs(10)).with_burst(5),
        )
        .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip())),
    );
    let url = serve(app(layer)).await;
    let c = client();
    for left in (0..5).rev() {
        let res = c.get(&url).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(
            header(&res, "ratelimit-policy").unwrap(),
            r#""per-key";q=5;w=10"#
        );
        let state = header(&res, "ratelimit").unwrap();
        // One cell is earned back every 2 s: the next is at most 2 s away.
        assert_eq!(state, format!(r#""per-key";r={left};t=2"#));
        assert!(res.headers().get("retry-after").is_none());
    }
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&res, "retry-after").unwrap(), "2");
    assert_eq!(
        header(&res, "ratelimit").unwrap(),
        r#""per-key";r=0;t=2"#,
        "t is the Retry-After on a deny"
    );
    assert_eq!(
        header(&res, "content-type").unwrap(),
        "application/problem+json"
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["rule"], "per-key");
    assert_eq!(body["retry_after"], 2);
    // Another API key has its own budget.
    let res = c
        .get(&url)
        .header("x-api-key", "other")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn retry_after_rounds_up_and_is_never_zero() {
    // One request per 1.5 s: the wait is just under 1.5 s, sent as 2.
    let layer = one_rule(Rule::new(
        "slow",
        KeyExtractor::everyone(),
        Quota::new(1, Duration::from_millis(1500)),
    ));
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(statuses(&c, &url, 1).await, [200]);
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after").unwrap(), "2");

    // 100 per second: the wait is ~10 ms, which must still be 1, not 0.
    let layer = one_rule(Rule::new(
        "fast",
        KeyExtractor::everyone(),
        Quota::per_second(100).with_burst(1),
    ));
    let url = serve(app(layer)).await;
    let mut seen = None;
    for _ in 0..20 {
        let res = c.get(&url).send().await.unwrap();
        if res.status() == 429 {
            seen = header(&res, "retry-after");
            break;
        }
    }
    assert_eq!(seen.as_deref(), Some("1"));
}

#[tokio::test]
async fn legacy_and_no_headers() {
    let rule = || Rule::new("r", KeyExtractor::everyone(), Quota::per_minute(3));
    let legacy = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule())
        .headers(HeaderStyle::Legacy)
        .build()
        .unwrap();
    let url = serve(app(legacy)).await;
    let c = client();
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(header(&res, "x-ratelimit-limit").unwrap(), "3");
    assert_eq!(header(&res, "x-ratelimit-remaining").unwrap(), "2");
    assert_eq!(header(&res, "x-ratelimit-reset").unwrap(), "20");
    assert!(res.headers().get("ratelimit").is_none());

    let none = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule())
        .headers(HeaderStyle::None)
        .build()
        .unwrap();
    let url = serve(app(none)).await;
    let res = c.get(&url).send().await.unwrap();
    assert!(
        res.headers()
            .keys()
            .all(|k| !k.as_str().contains("ratelimit"))
    );
    statuses(&c, &url, 2).await;
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "retry-after").unwrap(), "20");
}

#[tokio::test]
async fn rules_run_in_order_and_the_first_deny_short_circuits() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new(
            "per-key",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(2),
        ))
        .rule(Rule::new(
            "global",
            KeyExtractor::everyone(),
            Quota::per_minute(3),
        ))
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();
    let get = |k: &'static str| c.get(&url).header("x-api-key", k).send();
    let res = get("x").await.unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy").unwrap(),
        r#""per-key";q=2;w=60, "global";q=3;w=60"#
    );
    assert_eq!(
        header(&res, "ratelimit").unwrap(),
        r#""per-key";r=1;t=30, "global";r=2;t=20"#
    );
    assert_eq!(get("x").await.unwrap().status(), 200);
    let denied = get("x").await.unwrap();
    assert_eq!(denied.status(), 429);
    let body: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(body["rule"], "per-key");
    // The per-key deny did not spend the global budget: one unit is left.
    assert_eq!(get("y").await.unwrap().status(), 200);
    let denied = get("z").await.unwrap();
    assert_eq!(denied.status(), 429);
    let body: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(body["rule"], "global");
}

#[derive(Clone, Copy)]
enum Plan {
    Free,
    Pro,
}

async fn auth(mut req: Request, next: Next) -> Response {
    let plan = match req.headers().get("x-api-key").map(|v| v.as_bytes()) {
        Some(b"pro-key") => Some(Plan::Pro),
        Some(_) => Some(Plan::Free),
        None => None,
    };
    if let Some(plan) = plan {
        req.extensions_mut().insert(plan);
    }
    next.run(req).await
}

#[tokio::test]
async fn per_plan_quotas_from_an_auth_layer() {
    let layer = one_rule(
        Rule::new(
            "plan",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(2),
        )
        .quota_fn(|p| match p.extensions.get::<Plan>() {
            Some(Plan::Pro) => Quota::per_minute(4),
            Some(Plan::Free) | None => Quota::per_minute(2),
        }),
    );
    // Layers added later run first: auth sees the request before the limiter.
    let app = ok_app(layer).layer(middleware::from_fn(auth));
    let url = serve(app).await;
    let c = client();
    let run = |key: &'static str| {
        let c = c.clone();
        let url = url.clone();
        async move {
            let mut out = Vec::new();
            for _ in 0..6 {
                let res = c.get(&url).header("x-api-key", key).send().await.unwrap();
                out.push(res.status().as_u16());
            }
            out
        }
    };
    assert_eq!(run("free-key").await, [200, 200, 429, 429, 429, 429]);
    assert_eq!(run("pro-key").await, [200, 200, 200, 200, 429, 429]);
    let res = c
        .get(&url)
        .header("x-api-key", "pro-key")
        .send()
        .await
        .unwrap();
    assert_eq!(
        header(&res, "ratelimit-policy").unwrap(),
        r#""plan";q=4;w=60"#
    );
}

#[tokio::test]
async fn async_key_from_extensions_set_by_auth() {
    #[derive(Clone)]
    struct Tenant(String);
    async fn tenant_auth(mut req: Request, next: Next) -> Response {
        if let Some(k) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
            let t = Tenant(format!("tenant-of-{k}"));
            req.extensions_mut().insert(t);
        }
        next.run(req).await
    }
    let key = KeyExtractor::new_async("tenant", |parts| {
        let tenant = parts.extensions.get::<Tenant>().cloned();
        async move {
            tokio::task::yield_now().await; // a real lookup would await here
            tenant.map(|t| Key::from(t.0))
        }
    });
    let layer = one_rule(
        Rule::new("tenant", key, Quota::per_minute(2))
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
    );
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<RateLimitDecision>| async move {
                d.rules()[0].decision.remaining().to_string()
            }),
        )
        .layer(layer)
        .layer(middleware::from_fn(tenant_auth));
    let url = serve(app).await;
    let c = client();
    let res = c.get(&url).header("x-api-key", "a").send().await.unwrap();
    assert_eq!(res.text().await.unwrap(), "1");
    let res = c.get(&url).header("x-api-key", "a").send().await.unwrap();
    assert_eq!(res.text().await.unwrap(), "0");
    assert_eq!(
        c.get(&url)
            .header("x-api-key", "a")
            .send()
            .await
            .unwrap()
            .status(),
        429
    );
    assert_eq!(
        c.get(&url)
            .header("x-api-key", "b")
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert!(res.headers().get("retry-after").is_none());
    // A key from an auth layer's extension: the challenge asks for a token.
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["status"], 401);
    assert_eq!(body["rule"], "tenant");
}

#[tokio::test]
async fn missing_key_policies() {
    let c = client();
    let key = || KeyExtractor::header("x-api-key");
    let q = Quota::per_minute(1);

    let skip = serve(app(one_rule(Rule::new("r", key(), q)))).await;
    assert_eq!(statuses(&c, &skip, 3).await, [200, 200, 200]);
    let res = c.get(&skip).send().await.unwrap();
    assert!(
        res.headers().get("ratelimit").is_none(),
        "a skipped rule shows no headers"
    );

    let reject = serve(app(one_rule(
        Rule::new("r", key(), q).on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
    )))
    .await;
    assert_eq!(statuses(&c, &reject, 2).await, [401, 401]);
    let res = c
        .get(&reject)
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);

    let fallback = serve(app(one_rule(
        Rule::new("r", key(), q).on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip())),
    )))
    .await;
    assert_eq!(statuses(&c, &fallback, 2).await, [200, 429]);
    // The key holder is counted apart from the anonymous IP.
    let res = c
        .get(&fallback)
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
}

#[tokio::test]
async fn forwarded_for_spoofing_does_not_buy_a_new_budget() {
    let c = client();
    // The test client connects from 127.0.0.1: trust it as the proxy.
    let trusted = TrustedProxies::new(["127.0.0.1/32"]).unwrap();
    let layer = one_rule(Rule::new(
        "ip",
        KeyExtractor::client_ip(trusted),
        Quota::per_minute(2),
    ));
    let url = serve(app(layer)).await;
    let send = |xff: &'static str| c.get(&url).header("x-forwarded-for", xff).send();
    assert_eq!(send("203.0.113.5").await.unwrap().status(), 200);
    // Spoofed leftmost entries: the proxy still saw 203.0.113.5.
    assert_eq!(send("1.1.1.1, 203.0.113.5").await.unwrap().status(), 200);
    assert_eq!(send("2.2.2.2, 203.0.113.5").await.unwrap().status(), 429);
    assert_eq!(send("garbage, 203.0.113.5").await.unwrap().status(), 429);
    // A different real client has its own budget.
    assert_eq!(send("198.51.100.7").await.unwrap().status(), 200);

    // Untrusted peer: the header is ignored, everyone is 127.0.0.1.
    let untrusted = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let layer = one_rule(Rule::new(
        "ip",
        KeyExtractor::client_ip(untrusted),
        Quota::per_minute(2),
    ));
    let url = serve(app(layer)).await;
    for (xff, want) in [("9.9.9.1", 200), ("9.9.9.2", 200), ("9.9.9.3", 429)] {
        let res = c
            .get(&url)
            .header("x-forwarded-for", xff)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), want, "{xff}");
    }
}

#[tokio::test]
async fn non_utf8_and_overlong_keys_never_fail() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new(
            "k",
            KeyExtractor::header("x-api-key"),
            Quota::per_minute(1),
        ))
        .max_key_len(64)
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    let raw = http::HeaderValue::from_bytes(b"caf\xe9-\xff").unwrap();
    let send = |v: http::HeaderValue| c.get(&url).header("x-api-key", v).send();
    assert_eq!(send(raw.clone()).await.unwrap().status(), 200);
    assert_eq!(send(raw).await.unwrap().status(), 429);
    let other = http::HeaderValue::from_bytes(b"caf\xe9-\xfe").unwrap();
    assert_eq!(send(other).await.unwrap().status(), 200);

    // Two long keys that differ only at the end are still two keys.
    let a = format!("{}a", "x".repeat(4000));
    let b = format!("{}b", "x".repeat(4000));
    assert_eq!(send(a.parse().unwrap()).await.unwrap().status(), 200);
    assert_eq!(send(b.parse().unwrap()).await.unwrap().status(), 200);
    assert_eq!(send(a.parse().unwrap()).await.unwrap().status(), 429);
    assert_eq!(layer.local_keys(), 4);
}

#[tokio::test]
async fn request_time_costs_and_quotas_that_can_never_pass() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("bytes", KeyExtractor::everyone(), Quota::per_minute(10)).cost_fn(|p| {
                p.headers
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            }),
        )
        .rule(
            Rule::new(
                "plan",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(10),
            )
            .quota_fn(|p| {
                if p.headers.contains_key("x-broken") {
                    Quota::per_minute(0)
                } else {
                    Quota::per_minute(10)
                }
            }),
        )
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();
    let res = c.get(&url).header("x-cost", "11").send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert!(
        res.headers().get("retry-after").is_none(),
        "waiting would not help"
    );
    let body: serde_json::Value = res.json().await.unwrap();
    assert!(body.get("retry_after").is_none(), "no wait to give: {body}");

    let res = c.get(&url).header("x-cost", "0").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        header(&res, "ratelimit").is_none(),
        "a free request spends nothing"
    );
    let res = c.get(&url).header("x-cost", "4").send().await.unwrap();
    assert_eq!(
        header(&res, "ratelimit").unwrap(),
        r#""bytes";r=6;t=6"#,
        "the next unit of 10/min is 6 s away"
    );

    let res = c
        .get(&url)
        .header("x-api-key", "k")
        .header("x-broken", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 429);
    assert!(res.headers().get("retry-after").is_none());
}

#[test]
fn invalid_static_configuration_is_a_build_error() {
    let build = |rule: Rule| {
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule)
            .build()
            .unwrap_err()
    };
    let k = KeyExtractor::everyone;
    assert!(matches!(
        build(Rule::new("r", k(), Quota::per_second(0))),
        BuildError::InvalidQuota { .. }
    ));
    assert!(matches!(
        build(Rule::new("r", k(), Quota::per_second(5).with_burst(0))),
        BuildError::InvalidQuota { .. }
    ));
    assert_eq!(
        build(Rule::new("r", k(), Quota::per_second(5)).cost(6)),
        BuildError::CostAboveCapacity {
            rule: "r".into(),
            cost: 6,
            capacity: 5
        }
    );
    assert!(matches!(
        build(
            Rule::new("r", k(), Quota::per_second(5))
                .algorithm(keyed_rate_limit::Algorithm::FixedWindow)
        ),
        BuildError::AlgorithmNotLocal { .. }
    ));
    assert_eq!(
        build(Rule::new("", k(), Quota::per_second(1))),
        BuildError::InvalidRuleName(String::new())
    );
    assert_eq!(
        RateLimitLayer::builder()
            .decision_extension(true)
            .build()
            .unwrap_err(),
        BuildError::NoRules
    );
    let dup = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("a", k(), Quota::per_second(1)))
        .rule(Rule::new("a", k(), Quota::per_second(1)))
        .build()
        .unwrap_err();
    assert_eq!(dup, BuildError::DuplicateRule("a".into()));
    let zero = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("a", k(), Quota::per_second(1)))
        .instances(0)
        .build();
    assert!(matches!(zero.unwrap_err(), BuildError::InvalidSetting(_)));
}

#[tokio::test]
async fn route_layer_with_matched_route_keys() {
    let layer = one_rule(Rule::new(
        "route",
        KeyExtractor::matched_route(),
        Quota::per_minute(2),
    ));
    let app = Router::new()
        .route("/items/{id}", get(|| async { "item" }))
        .route("/other", get(|| async { "other" }))
        .route_layer(layer);
    let url = serve(app).await;
    let c = client();
    let get = |p: &str| c.get(format!("{url}{p}")).send();
    assert_eq!(get("/items/1").await.unwrap().status(), 200);
    assert_eq!(get("/items/2").await.unwrap().status(), 200);
    // `/items/{id}` is one budget whatever the id.
    assert_eq!(get("/items/3").await.unwrap().status(), 429);
    assert_eq!(get("/other").await.unwrap().status(), 200);
    // route_layer leaves unmatched paths alone: a 404, not a 429.
    assert_eq!(get("/missing").await.unwrap().status(), 404);
}

#[tokio::test]
async fn split_across_instances_enforces_a_share() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("g", KeyExtractor::everyone(), Quota::per_minute(9))
                .split_across_instances(true),
        )
        .instances(3)
        .build()
        .unwrap();
    let url = serve(app(layer)).await;
    assert_eq!(statuses(&client(), &url, 4).await, [200, 200, 200, 429]);
}

#[tokio::test]
async fn stale_keys_are_swept_in_the_background() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        // 1 ms per unit: a bucket is whole again moments after its request.
        .rule(Rule::new(
            "ip",
            KeyExtractor::header("x-k"),
            Quota::new(1000, Duration::from_secs(1)),
        ))
        .cleanup_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let url = serve(app(layer.clone())).await;
    let c = client();
    for i in 0..200 {
        let res = c
            .get(&url)
            .header("x-k", i.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    assert!(layer.local_keys() > 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while layer.local_keys() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} keys never swept",
            layer.local_keys()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Behind a proxy every client is the proxy: `peer_ip()` says so (once a
/// minute, not per request), and `client_ip()` says when a peer it does not
/// trust sends forwarding headers.
#[tokio::test]
async fn proxy_misconfigurations_are_reported_once_a_minute() {
    use crate::support::events::{capture, with_message};
    let (events, _guard) = capture();
    let layer = |key| {
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(Rule::new("ip", key, Quota::per_minute(100)))
            .build()
            .unwrap()
    };
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(KeyExtractor::peer_ip()));
    let url = serve(app).await;
    let c = client();
    for spoof in ["203.0.113.9", "198.51.100.7", "192.0.2.1"] {
        let res = c
            .get(&url)
            .header("x-forwarded-for", spoof)
            .send()
            .await
            .unwrap();
        // One key for all: the loopback peer's.
        assert_eq!(res.status(), 200);
    }
    let behind = with_message(&events, "peer_ip() sees");
    assert_eq!(behind.len(), 1, "{behind:?}");
    assert_eq!(behind[0]["kind"], "peer_ip_behind_proxy");

    let proxies = TrustedProxies::new(["10.0.0.0/8"]).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer(KeyExtractor::client_ip(proxies)));
    let url = serve(app).await;
    for _ in 0..2 {
        c.get(&url)
            .header("forwarded", "for=203.0.113.9")
            .send()
            .await
            .unwrap();
    }
    c.get(&url).send().await.unwrap();
    let untrusted = with_message(&events, "outside TrustedProxies");
    assert_eq!(untrusted.len(), 1, "{untrusted:?}");
    assert_eq!(untrusted[0]["kind"], "untrusted_forwarder");
}

#[tokio::test]
async fn an_invalid_ipv6_prefix_is_a_build_error() {
    for bad in [0, 129] {
        let rule = Rule::new(
            "ip",
            KeyExtractor::peer_ip_prefix(bad),
            Quota::per_minute(1),
        );
        let err = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule)
            .build()
            .unwrap_err();
        assert!(matches!(err, BuildError::InvalidKey { .. }), "{err}");
    }
}

/// RFC 9110 §11.6.1: a server sending 401 sends `WWW-Authenticate` with a
/// challenge. The layer's 401s (`OnMissingKey::Reject`) carry one naming
/// what the rule reads, unless the deny-response closure sets its own;
/// other rejection statuses carry none.
#[tokio::test]
async fn a_401_carries_a_challenge() {
    let c = client();
    let reject = |key: KeyExtractor, status| {
        Rule::new("r", key, Quota::per_minute(5)).on_missing_key(OnMissingKey::Reject(status))
    };
    let challenge = |res: &reqwest::Response| {
        res.headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned())
    };

    let api_key = serve(app(one_rule(reject(
        KeyExtractor::header("x-api-key"),
        StatusCode::UNAUTHORIZED,
    ))))
    .await;
    let res = c.get(&api_key).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(
        challenge(&res).as_deref(),
        Some(r#"ApiKey header="x-api-key""#)
    );
    let res = c
        .get(&api_key)
        .header("x-api-key", "k")
        .send()
        .await
        .unwrap();
    assert_eq!((res.status().as_u16(), challenge(&res)), (200, None));

    let bearer = serve(app(one_rule(reject(
        KeyExtractor::header("authorization"),
        StatusCode::UNAUTHORIZED,
    ))))
    .await;
    let res = c.get(&bearer).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(challenge(&res).as_deref(), Some("Bearer"));

    // The application's own challenge, from its deny response, is kept.
    let custom = RateLimitLayer::builder()
        .rule(reject(
            KeyExtractor::header("x-api-key"),
            StatusCode::UNAUTHORIZED,
        ))
        .deny_response(|denied| {
            let challenge = r#"Bearer realm="api", scope="read""#;
            let body = format!("sign in to {}", denied.rule());
            ([("www-authenticate", challenge)], body)
        })
        .build()
        .unwrap();
    let res = c.get(serve(app(custom)).await).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let all: Vec<_> = res.headers().get_all("www-authenticate").iter().collect();
    assert_eq!(all, [r#"Bearer realm="api", scope="read""#]);

    // 403 is not a challenge.
    let forbidden = serve(app(one_rule(reject(
        KeyExtractor::header("x-api-key"),
        StatusCode::FORBIDDEN,
    ))))
    .await;
    let res = c.get(&forbidden).send().await.unwrap();
    assert_eq!((res.status().as_u16(), challenge(&res)), (403, None));

    // The concurrency layer's 401 as well.
    let concurrency = keyed_rate_limit::ConcurrencyLimitLayer::builder(
        "in-flight",
        KeyExtractor::header("x-tenant"),
        2,
    )
    .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
    .build()
    .unwrap();
    let url = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(concurrency),
    )
    .await;
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(
        challenge(&res).as_deref(),
        Some(r#"ApiKey header="x-tenant""#)
    );
}
