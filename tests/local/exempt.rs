//! Exemptions (per rule and layer-wide) and the near-limit signal over a
//! real server: exempt requests spend nothing and show nothing, and both
//! are counted. Counters come from the binary's one recorder, under rule
//! names no other test uses; events from this thread's subscriber.

use axum::Router;
use axum::routing::get;
use keyed_rate_limit::{KeyExtractor, key::TrustedProxies};
use keyed_rate_limit::{Quota, RateLimitLayer, Rule};

use crate::support::{client, events, header, metrics, ok_app, serve};

const DECISIONS: &str = "rate_limit_decisions_total";

/// Three GETs of `url` with `headers`: their statuses.
async fn three(url: &str, headers: &[(&str, &str)]) -> Vec<u16> {
    let c = client();
    let mut out = Vec::new();
    for _ in 0..3 {
        let mut req = c.get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        out.push(req.send().await.unwrap().status().as_u16());
    }
    out
}

async fn serve_rule(rule: Rule) -> String {
    serve(ok_app(
        RateLimitLayer::builder().rule(rule).build().unwrap(),
    ))
    .await
}

#[tokio::test]
async fn an_exempt_closure_lets_its_requests_through_uncounted() {
    metrics::snapshotter();
    let url = serve_rule(
        Rule::new("ex-fn", KeyExtractor::everyone(), Quota::per_hour(2))
            .exempt(|p| p.headers.contains_key("x-internal")),
    )
    .await;
    assert_eq!(three(&url, &[("x-internal", "1")]).await, [200, 200, 200]);
    // Nothing was spent: the quota is whole for the others.
    assert_eq!(three(&url, &[]).await, [200, 200, 429]);
    assert_eq!(metrics::counter(DECISIONS, "ex-fn", "exempt"), 3);
    assert_eq!(metrics::counter(DECISIONS, "ex-fn", "deny"), 1);
}

#[tokio::test]
async fn exempt_ips_match_the_peer_of_a_peer_ip_rule() {
    metrics::snapshotter();
    let exempt = serve_rule(
        Rule::new("ex-peer", KeyExtractor::peer_ip(), Quota::per_hour(2))
            .exempt_ips(["10.0.0.0/8", "127.0.0.0/8"]),
    )
    .await;
    assert_eq!(three(&exempt, &[]).await, [200, 200, 200]);
    assert_eq!(metrics::counter(DECISIONS, "ex-peer", "exempt"), 3);

    let other = serve_rule(
        Rule::new("ex-peer-no", KeyExtractor::peer_ip(), Quota::per_hour(2))
            .exempt_ips(["10.0.0.0/8", "::1"]),
    )
    .await;
    assert_eq!(three(&other, &[]).await, [200, 200, 429]);
    assert_eq!(metrics::counter(DECISIONS, "ex-peer-no", "exempt"), 0);

    // A key that is no address: the TCP peer's, from ConnectInfo.
    let by_header = serve_rule(
        Rule::new(
            "ex-header",
            KeyExtractor::header("x-api-key"),
            Quota::per_hour(2),
        )
        .exempt_ips(["127.0.0.1"]),
    )
    .await;
    assert_eq!(
        three(&by_header, &[("x-api-key", "k")]).await,
        [200, 200, 200]
    );
}

#[tokio::test]
async fn exempt_ips_of_a_client_ip_rule_trust_only_its_proxies() {
    metrics::snapshotter();
    let rule = |name: &str, proxies: &[&str]| {
        Rule::new(
            name,
            KeyExtractor::client_ip(TrustedProxies::new(proxies).unwrap()),
            Quota::per_hour(2),
        )
        .exempt_ips(["192.0.2.0/24"])
    };
    // The test client is the trusted proxy: the client it reports counts.
    let behind = serve_rule(rule("ex-client", &["127.0.0.1"])).await;
    let office = [("x-forwarded-for", "198.51.100.7, 192.0.2.9")];
    assert_eq!(three(&behind, &office).await, [200, 200, 200]);
    // The leftmost entry is the client's own word: not believed.
    let forged = [("x-forwarded-for", "192.0.2.9, 198.51.100.7")];
    assert_eq!(three(&behind, &forged).await, [200, 200, 429]);
    assert_eq!(metrics::counter(DECISIONS, "ex-client", "exempt"), 3);

    // A peer outside the trusted proxies: its X-Forwarded-For is forged.
    let direct = serve_rule(rule("ex-spoof", &["10.0.0.0/8"])).await;
    let spoof = [("x-forwarded-for", "192.0.2.9")];
    assert_eq!(three(&direct, &spoof).await, [200, 200, 429]);
    assert_eq!(metrics::counter(DECISIONS, "ex-spoof", "exempt"), 0);
}

#[tokio::test]
async fn an_exempt_rule_sends_no_headers_and_the_others_still_apply() {
    metrics::snapshotter();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "ex-all",
            KeyExtractor::everyone(),
            Quota::per_hour(100),
        ))
        .rule(
            Rule::new("ex-some", KeyExtractor::everyone(), Quota::per_hour(50))
                .exempt(|p| p.headers.contains_key("x-internal")),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let c = client();
    let res = c.get(&url).header("x-internal", "1").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(&res, "ratelimit-policy").unwrap(),
        r#""ex-all";q=100;w=3600"#
    );
    assert!(!header(&res, "ratelimit").unwrap().contains("ex-some"));
    let res = c.get(&url).send().await.unwrap();
    let policy = header(&res, "ratelimit-policy").unwrap();
    assert!(policy.contains("ex-some"), "{policy}");
}

#[tokio::test]
async fn the_layer_wide_exemption_skips_every_rule_and_is_counted_once() {
    metrics::snapshotter();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "ex-layer-a",
            KeyExtractor::everyone(),
            Quota::per_hour(1),
        ))
        .rule(Rule::new(
            "ex-layer-b",
            KeyExtractor::peer_ip(),
            Quota::per_hour(1),
        ))
        .exempt(|p| p.uri.path() == "/healthz")
        .build()
        .unwrap();
    assert!(
        layer
            .describe()
            .markdown()
            .starts_with("Exempt from every rule: fn\n\n| # |")
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/healthz", get(|| async { "healthy" }))
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    for _ in 0..4 {
        let res = c.get(format!("{url}/healthz")).send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers().get("ratelimit-policy").is_none());
        assert!(res.headers().get("ratelimit").is_none());
    }
    assert_eq!(three(&url, &[]).await, [200, 429, 429]);
    assert_eq!(metrics::counter(DECISIONS, "*", "exempt"), 4);
    assert_eq!(metrics::counter(DECISIONS, "ex-layer-a", "exempt"), 0);
    assert_eq!(metrics::counter(DECISIONS, "ex-layer-b", "exempt"), 0);
}

#[test]
fn describe_shows_exemptions() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("d-both", KeyExtractor::peer_ip(), Quota::per_hour(10))
                .exempt_ips(["10.0.0.0/8"])
                .exempt(|_| false),
        )
        .rule(Rule::new("d-fn", KeyExtractor::everyone(), Quota::per_hour(10)).exempt(|_| false))
        .build()
        .unwrap();
    let d = layer.describe();
    let on_deny: Vec<_> = d.rules().iter().map(|r| r.on_deny.as_str()).collect();
    assert_eq!(
        on_deny,
        [
            "429 + Retry-After, exempt: 10.0.0.0/8 + fn",
            "429 + Retry-After, exempt: fn",
        ]
    );
    assert!(d.markdown().starts_with("| # |"));
}

#[test]
fn invalid_exempt_ips_are_build_errors() {
    let err = RateLimitLayer::builder()
        .rule(
            Rule::new("bad-ip", KeyExtractor::peer_ip(), Quota::per_hour(1))
                .exempt_ips(["10.0.0.0/8", "10.0.0.0/33"]),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rule "bad-ip": exempt_ips entry "10.0.0.0/33" is not a CIDR or IP address"#
    );
}

#[test]
fn describe_shows_near_limit_ratios_other_than_the_default() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("d-tenth", KeyExtractor::everyone(), Quota::per_hour(10))
                .near_limit_ratio(Some(0.1)),
        )
        .rule(
            Rule::new("d-off", KeyExtractor::everyone(), Quota::per_hour(10))
                .near_limit_ratio(None),
        )
        .rule(Rule::new(
            "d-default",
            KeyExtractor::everyone(),
            Quota::per_hour(10),
        ))
        .build()
        .unwrap();
    let d = layer.describe();
    let on_deny: Vec<_> = d.rules().iter().map(|r| r.on_deny.as_str()).collect();
    assert_eq!(
        on_deny,
        [
            "429 + Retry-After, near limit < 10%",
            "429 + Retry-After, near limit off",
            "429 + Retry-After",
        ]
    );
}

#[test]
fn near_limit_ratios_outside_zero_to_one_are_build_errors() {
    let build = |ratio| {
        let rule = Rule::new("bad-ratio", KeyExtractor::peer_ip(), Quota::per_hour(1))
            .near_limit_ratio(Some(ratio));
        RateLimitLayer::builder().rule(rule).build()
    };
    for ratio in [0.0, -0.1, 1.01, f64::NAN] {
        assert!(build(ratio).is_err(), "{ratio}");
    }
    assert!(build(1.0).is_ok());
}

#[tokio::test]
async fn near_limit_is_counted_each_time_and_logged_once_a_second() {
    metrics::snapshotter();
    let (events, _guard) = events::capture();
    // 20 an hour, the default 0.2: the 17th to 20th leave 3 to 0 units.
    let url = serve_rule(Rule::new(
        "near-default",
        KeyExtractor::everyone(),
        Quota::per_hour(20),
    ))
    .await;
    let c = client();
    let ok = || async { c.get(&url).send().await.unwrap().status().as_u16() };
    for i in 1..=16 {
        assert_eq!(ok().await, 200, "{i}");
    }
    assert_eq!(metrics::counter(DECISIONS, "near-default", "near_limit"), 0);
    assert_eq!(ok().await, 200);
    // Another test's thread may have registered the event's callsite while
    // no capture was alive, caching "never": ask again with ours.
    tracing::callsite::rebuild_interest_cache();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    for _ in 18..=20 {
        assert_eq!(ok().await, 200);
    }
    // The deny that follows is no near-limit.
    assert_eq!(ok().await, 429);
    assert_eq!(metrics::counter(DECISIONS, "near-default", "near_limit"), 4);
    let lines: Vec<_> = events::with_message(&events, "near the rate limit")
        .into_iter()
        .filter(|e| e["rule"] == "near-default" && e["remaining"] != "3")
        .collect();
    assert_eq!(lines.len(), 1, "one line a second: {lines:?}");
    assert_eq!(lines[0]["remaining"], "2");
    assert_eq!(lines[0]["limit"], "20");
    assert_eq!(lines[0]["suppressed"], "0");
}

#[tokio::test]
async fn near_limit_follows_the_rule_ratio_and_none_turns_it_off() {
    metrics::snapshotter();
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("near-half", KeyExtractor::everyone(), Quota::per_hour(10))
                .near_limit_ratio(Some(0.5)),
        )
        .rule(
            Rule::new("near-off", KeyExtractor::everyone(), Quota::per_hour(100))
                .near_limit_ratio(None),
        )
        .rule(
            // A quota per request: its threshold comes with each decision.
            Rule::new("near-dyn", KeyExtractor::everyone(), Quota::per_hour(1))
                .quota_fn(|_| Quota::per_hour(20)),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let c = client();
    for _ in 0..10 {
        assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    }
    // 10 and 0.5: remaining 4 down to 0.
    assert_eq!(metrics::counter(DECISIONS, "near-half", "near_limit"), 5);
    assert_eq!(metrics::counter(DECISIONS, "near-off", "near_limit"), 0);
    // 20 and 0.2: below 4 left, not yet.
    assert_eq!(metrics::counter(DECISIONS, "near-dyn", "near_limit"), 0);
}

#[tokio::test]
async fn a_quota_fn_rule_is_near_its_limit_by_the_decided_quota() {
    metrics::snapshotter();
    let url = serve_rule(
        Rule::new("near-fn", KeyExtractor::everyone(), Quota::per_hour(1000))
            .quota_fn(|_| Quota::per_hour(5)),
    )
    .await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    }
    // 5 and 0.2: only the last leaves fewer than 1.
    assert_eq!(metrics::counter(DECISIONS, "near-fn", "near_limit"), 1);
}

#[cfg(feature = "config")]
#[tokio::test]
async fn a_rules_file_sets_exemptions_and_the_near_limit_ratio() {
    use keyed_rate_limit::{Registry, RulesConfig};
    metrics::snapshotter();
    let registry = Registry::new().exempt_fn("health", |p| p.uri.path() == "/healthz");
    let layer = RulesConfig::from_toml_str(
        r#"
exempt_fn = "health"

[[rules]]
name = "file-office"
key = "peer_ip"
quota = "2/h"
exempt_ips = ["127.0.0.0/8"]

[[rules]]
name = "file-all"
key = "everyone"
quota = "4/h"
near_limit_ratio = 0.5
"#,
    )
    .unwrap()
    .into_layer(&registry)
    .unwrap();
    // Not sent a health check: the layer-wide counter is another test's.
    assert!(layer.describe().layer_exempt());
    let url = serve(ok_app(layer)).await;
    // The loopback peer skips file-office; file-all counts and nears its limit.
    assert_eq!(three(&url, &[]).await, [200, 200, 200]);
    assert_eq!(metrics::counter(DECISIONS, "file-office", "exempt"), 3);
    // 4 and 0.5: the 3rd leaves 1, under 2.
    assert_eq!(metrics::counter(DECISIONS, "file-all", "near_limit"), 1);
}
