//! Rules from TOML and YAML files with global rules, on a private
//! `redis-server`, driven over real HTTP.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::{
    CONFIG_TOML as TOML, get_with, guide_block, header, ok_app, serve, statuses_with,
};
use keyed_rate_limit::{Key, KeyExtractor, Quota, RedisBackend, Registry, RulesConfig};
use keyed_rate_limit_testing::RedisServer;

#[tokio::test]
async fn toml_file_makes_a_working_layer() {
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url())
        .prefix("cfg-toml")
        .build()
        .await
        .unwrap();
    let registry = Registry::new()
        .redis(redis)
        .key(
            "tenant",
            KeyExtractor::new("tenant", |p| {
                p.headers
                    .get("x-tenant")
                    .map(|v| Key::new(v.as_bytes().to_vec()))
            }),
        )
        .quota_fn("plan", |_| Quota::per_minute(5))
        .cost_fn("weight", |_| 1);
    let layer = RulesConfig::from_toml_str(TOML)
        .unwrap()
        .into_layer(&registry)
        .unwrap();
    assert_eq!(
        layer
            .rules()
            .iter()
            .map(|r| r.key().name())
            .collect::<Vec<_>>(),
        ["everyone", "header:x-api-key|peer_ip", "tenant"]
    );
    let url = serve(ok_app(layer)).await;

    // No tenant: the global rule rejects with the configured status.
    let res = get_with(&url, &[("x-api-key", "z")]).await;
    assert_eq!(res.status().as_u16(), 401);

    // Key "a": three allowed by per-key, then per-key denies (the shadow rule never does).
    let a = [("x-api-key", "a"), ("x-tenant", "t")];
    let res = get_with(&url, &a).await;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(header(&res, "x-ratelimit-limit").as_deref(), Some("3"));
    assert!(
        header(&res, "ratelimit-policy")
            .unwrap()
            .contains("\"per-tenant\";q=5;w=60")
    );
    assert_eq!(statuses_with(&url, &a, 3).await, [200, 200, 429]);

    // Key "b", same tenant: the tenant's 5 per minute (3 spent) run out in Redis.
    let b = [("x-api-key", "b"), ("x-tenant", "t")];
    assert_eq!(statuses_with(&url, &b, 3).await, [200, 200, 429]);
    let res = get_with(&url, &b).await;
    assert_eq!(res.status().as_u16(), 429);
    assert!(res.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn lease_and_coalesce_from_the_file_reach_the_rules_and_describe() {
    let server = RedisServer::start();
    let redis = server.backend("cfg-lease").await;
    let config = RulesConfig::from_toml_str(
        "[[rules]]\nname = \"tenant\"\nkey = \"header:x-tenant\"\nquota = \"5000/s\"\nscope = \"global\"\nlease = { ttl = \"50ms\", max_units = 500 }\n\n\
         [[rules]]\nname = \"ip\"\nkey = \"header:x-ip\"\nquota = \"50/s\"\nscope = \"global\"\ncoalesce = false\n\n\
         [[rules]]\nname = \"window\"\nkey = \"header:x-ip\"\nquota = \"50/s\"\nalgorithm = \"fixed_window\"\nscope = \"global\"\nlease = { ttl = \"1s\" }\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new().redis(redis)).unwrap();
    let lease = layer.rules()[0].get_lease().unwrap();
    assert_eq!(
        (lease.ttl(), lease.max_units()),
        (Duration::from_millis(50), 500)
    );
    assert!(!layer.rules()[1].get_coalesce() && layer.rules()[1].get_lease().is_none());
    let scopes: Vec<String> = layer
        .describe()
        .rules()
        .iter()
        .map(|r| r.scope.clone())
        .collect();
    assert_eq!(
        scopes,
        [
            "global, leased 50ms: Redis burst 4750",
            "global, exact",
            "global, leased 1s: ends with its window"
        ]
    );
}

/// The guide's full example loads as written, given what it says it needs:
/// the registry's `tenant`, `plan` and `weight`, and a Redis backend.
#[tokio::test]
async fn the_guides_full_examples_load() {
    #[derive(Clone)]
    struct Tenant(u64);
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url())
        .prefix("guide")
        .build()
        .await
        .unwrap();
    let registry = || {
        Registry::new()
            .key(
                "tenant",
                KeyExtractor::extension::<Tenant>(|t| Key::from(t.0)),
            )
            .quota_fn("plan", |_| Quota::per_minute(60))
            .cost_fn("weight", |_| 1)
            .redis(redis.clone())
    };
    let toml = guide_block("# Full example (TOML)", "```toml\n");
    let layer = RulesConfig::from_toml_str(&toml)
        .unwrap()
        .into_layer(&registry())
        .unwrap();
    let names: Vec<_> = layer.rules().iter().map(|r| r.name().to_owned()).collect();
    assert_eq!(names, ["per-key", "per-client", "per-tenant", "new-limit"]);
    let yaml = guide_block("The same in YAML:", "```yaml\n");
    let layer = RulesConfig::from_yaml_str(&yaml)
        .unwrap()
        .into_layer(&registry())
        .unwrap();
    assert_eq!(layer.rules().len(), 2);
}

#[tokio::test]
async fn a_partial_failure_mode_comes_from_toml_and_yaml() {
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url())
        .prefix("cfg-partial")
        .build()
        .await
        .unwrap();
    let registry = Registry::new().redis(redis);
    let toml = |p: u32| {
        format!(
            "instances = 2\n[[rules]]\nname = \"shed\"\nkey = \"everyone\"\nquota = \"10/s\"\n\
             scope = \"global\"\nfailure_mode = {{ refuse_percent = {p} }}\n"
        )
    };
    let yaml = "instances: 2\nrules:\n  - name: shed\n    key: everyone\n    quota: 10/s\n    \
                scope: global\n    failure_mode: { refuse_percent: 25 }\n";
    for layer in [
        RulesConfig::from_toml_str(&toml(25))
            .unwrap()
            .into_layer(&registry),
        RulesConfig::from_yaml_str(yaml)
            .unwrap()
            .into_layer(&registry),
    ] {
        let rules = layer.unwrap().describe().rules().to_vec();
        assert_eq!(
            rules[0].failure_mode.as_deref(),
            Some("refuse_percent 25, 20ms timeout")
        );
    }
    let err = RulesConfig::from_toml_str(&toml(101))
        .unwrap()
        .into_layer(&registry)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("refuse_percent must be at most 100"),
        "{err}"
    );
    let typo = toml(25).replace("{ refuse_percent = 25 }", "\"fail_opn\"");
    let err = RulesConfig::from_toml_str(&typo).unwrap_err().to_string();
    assert!(
        err.contains("unknown variant `fail_opn`, expected one of `fail_open`"),
        "{err}"
    );
}
