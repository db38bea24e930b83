//! Any-of groups over HTTP: a steady quota with a burst pool, the group's
//! place in the chain (an earlier deny skips it, a later deny refunds the
//! member charged), its headers and `Retry-After`, and its build checks.

use std::time::Duration;

use crate::support::sf::{member, members};
use crate::support::{get_with as get, header, ok_app, serve};
use keyed_rate_limit::BuildError;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, rule, rule::OnDeny};

fn key() -> KeyExtractor {
    KeyExtractor::header("x-api-key")
}

/// Two an hour steadily, then a pool of three more.
fn bursty() -> Vec<Rule> {
    rule::any_of(
        "api",
        [
            Rule::new("steady", key(), Quota::per_hour(2)),
            Rule::new("burst-pool", key(), Quota::per_hour(3)),
        ],
    )
}

#[tokio::test]
async fn a_burst_pool_admits_what_the_steady_quota_refuses() {
    let layer = RateLimitLayer::builder().rules(bursty()).build().unwrap();
    let url = serve(ok_app(layer)).await;
    let a = [("x-api-key", "a")];
    // The steady quota first, with the pool read but not spent.
    for left in [1, 0] {
        let res = get(&url, &a).await;
        assert_eq!(res.status(), 200);
        assert_eq!(member(&res, "ratelimit", "steady").int("r"), Some(left));
        assert_eq!(member(&res, "ratelimit", "burst-pool").int("r"), Some(3));
        let policy = header(&res, "ratelimit-policy").unwrap();
        let names: Vec<_> = members(&policy).into_iter().map(|m| m.name).collect();
        assert_eq!(
            names,
            ["steady", "burst-pool"],
            "every member in the policy"
        );
    }
    // Then the pool, the empty steady quota shown before it.
    for left in [2, 1, 0] {
        let res = get(&url, &a).await;
        assert_eq!(res.status(), 200);
        assert_eq!(member(&res, "ratelimit", "steady").int("r"), Some(0));
        assert_eq!(member(&res, "ratelimit", "burst-pool").int("r"), Some(left));
    }
    // Both refuse: every member in the headers, the soonest's Retry-After.
    let res = get(&url, &a).await;
    assert_eq!(res.status(), 429);
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    // The pool's unit is back in 20 minutes, the steady one's in 30.
    assert!((1190..=1200).contains(&retry), "Retry-After {retry}");
    let state = members(&header(&res, "ratelimit").unwrap());
    let names: Vec<_> = state.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["steady", "burst-pool"], "the group's order");
    assert_eq!(state[1].int("t"), Some(retry as i64));
    // Another key has its own members.
    assert_eq!(get(&url, &[("x-api-key", "b")]).await.status(), 200);
}

/// The first member answers sooner than the second: the refusal keeps the
/// group's order all the same, and its body names every member.
#[tokio::test]
async fn a_refusal_keeps_the_allow_order_and_names_every_member() {
    let layer = RateLimitLayer::builder()
        .any_of(
            "api",
            [
                Rule::new("steady", key(), Quota::per_minute(1)),
                Rule::new("burst-pool", key(), Quota::per_hour(1)),
            ],
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let a = [("x-api-key", "a")];
    let order = |res: &reqwest::Response| -> Vec<String> {
        members(&header(res, "ratelimit").unwrap())
            .into_iter()
            .map(|m| m.name)
            .collect()
    };
    for _ in 0..2 {
        let res = get(&url, &a).await;
        assert_eq!(res.status(), 200);
        assert_eq!(order(&res), ["steady", "burst-pool"]);
    }
    let res = get(&url, &a).await;
    assert_eq!(res.status(), 429);
    assert_eq!(order(&res), ["steady", "burst-pool"], "the allow order");
    let retry: i64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!(
        (50..=60).contains(&retry),
        "the steady unit, soonest: {retry}"
    );
    assert_eq!(member(&res, "ratelimit", "steady").int("t"), Some(retry));
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["steady", "burst-pool"])
    );
    assert_eq!(body["rule"], "steady", "the member that gives the wait");
}

#[tokio::test]
async fn the_group_stands_in_the_chain_as_one_rule() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "before",
            KeyExtractor::header("x-before"),
            Quota::per_hour(1),
        ))
        .rules(bursty())
        .rule(Rule::new(
            "after",
            KeyExtractor::header("x-after"),
            Quota::per_hour(1),
        ))
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let steady = |res: &reqwest::Response| member(res, "ratelimit", "steady").int("r");
    // An earlier rule's deny: the group is not asked.
    assert_eq!(
        get(&url, &[("x-api-key", "k"), ("x-before", "b")])
            .await
            .status(),
        200
    );
    let res = get(&url, &[("x-api-key", "k"), ("x-before", "b")]).await;
    assert_eq!(res.status(), 429);
    assert_eq!(
        header(&res, "ratelimit").unwrap().matches("steady").count(),
        0
    );
    // A later rule's deny gives the charged member its unit back.
    let res = get(&url, &[("x-api-key", "k"), ("x-after", "x")]).await;
    assert_eq!((res.status().as_u16(), steady(&res)), (200, Some(0)));
    let res = get(&url, &[("x-api-key", "k"), ("x-after", "x")]).await;
    assert_eq!(res.status(), 429, "`after` refuses");
    let res = get(&url, &[("x-api-key", "k")]).await;
    assert_eq!(res.status(), 200);
    assert_eq!(steady(&res), Some(0), "the pool admitted it, not steady");
    assert_eq!(
        member(&res, "ratelimit", "burst-pool").int("r"),
        Some(2),
        "the refused request's pool unit was given back"
    );
}

#[tokio::test]
async fn a_member_without_a_key_is_skipped() {
    let layer = RateLimitLayer::builder()
        .any_of(
            "user-or-tenant",
            [
                Rule::new(
                    "per-user",
                    KeyExtractor::header("x-user"),
                    Quota::per_hour(1),
                ),
                Rule::new(
                    "per-tenant",
                    KeyExtractor::header("x-tenant"),
                    Quota::per_hour(2),
                ),
            ],
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let t = [("x-tenant", "t")];
    let codes = [
        get(&url, &t).await.status().as_u16(),
        get(&url, &t).await.status().as_u16(),
        get(&url, &t).await.status().as_u16(),
    ];
    assert_eq!(codes, [200, 200, 429], "the tenant's overflow alone");
    // No key at all: no member applies, nothing limits.
    assert_eq!(get(&url, &[]).await.status(), 200);
}

#[test]
fn members_that_never_refuse_or_stand_apart_are_build_errors() {
    let member = |name: &str| Rule::new(name, key(), Quota::per_second(1));
    let build = |rules: Vec<Rule>| RateLimitLayer::builder().rules(rules).build().err();
    let group_err = |e: Option<BuildError>| match e {
        Some(BuildError::InvalidGroup { group, error }) => (group, error.to_owned()),
        other => panic!("{other:?}"),
    };
    let (g, e) = group_err(build(rule::any_of(
        "g",
        [member("a").shadow(true), member("b")],
    )));
    assert_eq!(g, "g");
    assert!(e.contains("shadow"), "{e}");
    let wait = OnDeny::Wait {
        max: Duration::from_secs(1),
        queue: 1,
    };
    let (_, e) = group_err(build(rule::any_of(
        "g",
        [member("a").on_deny(wait), member("b")],
    )));
    assert!(e.contains("wait"), "{e}");
    let mut apart = rule::any_of("g", [member("a")]);
    apart.push(member("b"));
    apart.extend(rule::any_of("g", [member("c")]));
    let (_, e) = group_err(build(apart));
    assert!(e.contains("together"), "{e}");
    let (_, e) = group_err(build(rule::any_of("a", [member("a"), member("b")])));
    assert!(e.contains("name"), "{e}");
    // Member names are rule names: unique across the chain.
    let mut twice = rule::any_of("g", [member("a")]);
    twice.push(member("a"));
    assert!(matches!(build(twice), Some(BuildError::DuplicateRule(_))));
}

#[test]
fn describe_shows_the_group() {
    let layer = RateLimitLayer::builder().rules(bursty()).build().unwrap();
    let d = layer.describe();
    let groups: Vec<_> = d.rules().iter().map(|r| r.group.as_deref()).collect();
    assert_eq!(groups, [Some("api"), Some("api")]);
    assert_eq!(d.rules()[0].on_deny, "any_of api: the next member");
    assert!(d.rules()[1].on_deny.contains("once every member refused"));
    let m = d.mermaid();
    assert!(m.contains("d1 -->|no| r2"), "{m}");
    assert!(m.contains("d1 -->|yes| service[service]"), "{m}");
    assert!(m.contains("d2 -->|no| deny"), "{m}");
}

#[cfg(feature = "config")]
#[test]
fn rule_files_group_consecutive_rules() {
    use keyed_rate_limit::{Registry, RulesConfig};
    let config = RulesConfig::from_toml_str(
        r#"
        [[rules]]
        name = "steady"
        key = "header:x-api-key"
        quota = "2/h"
        any_of = "api"

        [[rules]]
        name = "burst-pool"
        key = "header:x-api-key"
        quota = "3/h"
        any_of = "api"
        "#,
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    let groups: Vec<_> = layer
        .describe()
        .rules()
        .iter()
        .map(|r| r.group.clone())
        .collect();
    assert_eq!(groups, [Some("api".to_owned()), Some("api".to_owned())]);
}
