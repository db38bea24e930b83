//! Rules from TOML and YAML files, driven over real HTTP, and the errors
//! bad files give.

use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support::Backend as _;
use crate::support::{client, header, serve};
use axum::{Router, routing::get};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{Key, KeyExtractor, Quota, RateLimitLayer};
use keyed_rate_limit::{Registry, RulesConfig};
use keyed_rate_limit_testing::RedisServer;

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn get_with(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = c.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn statuses(c: &reqwest::Client, url: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(get_with(c, url, headers).await.status().as_u16());
    }
    out
}

const TOML: &str = r#"
headers = "both"
instances = 1
max_key_len = 64

[[rules]]
name = "dark-launch"
key = "everyone"
quota = "1/min"
shadow = true

[[rules]]
name = "per-key"
key = "header:x-api-key|peer_ip"
quota = "3/min"
burst = 3
algorithm = "gcra"

[[rules]]
name = "per-tenant"
key = "extension:tenant"
quota_fn = "plan"
cost_fn = "weight"
algorithm = "fixed_window"
scope = "global"
failure_mode = "fail_closed"
timeout = "500ms"
breaker = { failure_threshold = 3, open_for = "2s" }
on_missing_key = "reject:401"
"#;

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
    let url = serve(app(layer)).await;
    let c = client();

    // No tenant: the global rule rejects with the configured status.
    let res = get_with(&c, &url, &[("x-api-key", "z")]).await;
    assert_eq!(res.status().as_u16(), 401);

    // Key "a": three allowed by per-key, then per-key denies (the shadow rule never does).
    let a = [("x-api-key", "a"), ("x-tenant", "t")];
    let res = get_with(&c, &url, &a).await;
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(header(&res, "x-ratelimit-limit").as_deref(), Some("3"));
    assert!(
        header(&res, "ratelimit-policy")
            .unwrap()
            .contains("\"per-tenant\";q=5;w=60")
    );
    assert_eq!(statuses(&c, &url, &a, 3).await, [200, 200, 429]);

    // Key "b", same tenant: the tenant's 5 per minute (3 spent) run out in Redis.
    let b = [("x-api-key", "b"), ("x-tenant", "t")];
    assert_eq!(statuses(&c, &url, &b, 3).await, [200, 200, 429]);
    let res = get_with(&c, &url, &b).await;
    assert_eq!(res.status().as_u16(), 429);
    assert!(res.headers().contains_key("retry-after"));
}

const YAML: &str = r#"
headers: legacy
rules:
  - name: per-client
    key: client_ip
    trusted_proxies: ["127.0.0.1"]
    quota: 2/10s
    algorithm: token_bucket
    on_missing_key: fallback:peer_ip
  - name: everyone
    key: everyone
    quota: 6/min
    cost: 2
"#;

#[tokio::test]
async fn yaml_file_makes_a_working_layer() {
    let layer = RulesConfig::from_yaml_str(YAML)
        .unwrap()
        .into_layer(&Registry::new())
        .unwrap();
    let url = serve(app(layer)).await;
    let c = client();

    // Clients behind the trusted proxy (the test's own 127.0.0.1) count apart.
    let one = [("x-forwarded-for", "198.51.100.1")];
    let res = get_with(&c, &url, &one).await;
    assert_eq!(header(&res, "x-ratelimit-limit").as_deref(), Some("2"));
    assert!(
        !res.headers().contains_key("ratelimit-policy"),
        "legacy only"
    );
    assert_eq!(statuses(&c, &url, &one, 2).await, [200, 429]);

    // A second client has its own 2, but "everyone" (6 units at cost 2) has 1 request left.
    let two = [("x-forwarded-for", "198.51.100.2")];
    assert_eq!(statuses(&c, &url, &two, 2).await, [200, 429]);
}

/// Each bad file: the message, and where it points.
#[test]
fn a_lockout_from_the_file_reaches_the_rule_and_describe() {
    let config = RulesConfig::from_toml_str(
        "[[rules]]\nname = \"login\"\nkey = \"header:x-user\"\nquota = \"5/min\"\nlockout = { after = 5, within = \"1m\", block_for = \"15m\" }\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    let lockout = layer.rules()[0].get_lockout().unwrap();
    assert_eq!(
        (lockout.after(), lockout.within(), lockout.block_for()),
        (5, Duration::from_secs(60), Duration::from_secs(900))
    );
    assert_eq!(
        layer.describe().rules()[0].on_deny,
        "429 + Retry-After, lockout: 5 denies/min -> 15min"
    );
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

#[test]
fn invalid_configs_point_at_the_field() {
    let toml_cases = [
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"100/fortnight\"\n",
            "invalid quota \"100/fortnight\"",
            4,
            9,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nburts = 2\n",
            "unknown field `burts`",
            5,
            1,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"header:x-api-key\"\nquota = \"1/s\"\ntimeout = \"20\"\nscope = \"global\"\n",
            "invalid duration \"20\"",
            5,
            11,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nalgorithm = \"leaky\"\n",
            "unknown variant `leaky`",
            5,
            13,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\non_missing_key = \"reject:500\"\n",
            "reject needs a 4xx status",
            5,
            18,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nlockout = { after = 0, within = \"1m\", block_for = \"15m\" }\n",
            "`lockout`: invalid setting: a lockout needs at least one deny",
            1,
            1,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nlockout = { after = 5, within = \"1m\", block = \"15m\" }\n",
            "unknown field `block`",
            5,
            39,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nlease = { ttl = \"50ms\", size = 3 }\n",
            "unknown field `size`",
            5,
            25,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\ncoalesce = true\n",
            "`coalesce` only applies to `scope = \"global\"`",
            1,
            1,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nscope = \"global\"\nlease = { ttl = \"2m\" }\n",
            "`lease`: invalid setting: a lease's ttl must be between 1 ms and 60 s",
            1,
            1,
        ),
        (
            "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"10/s\"\nscope = \"global\"\nlease = { ttl = \"1s\" }\n",
            "`lease`: a ttl of 1s holds back 10 units, the whole burst of 10",
            1,
            1,
        ),
        ("bogus = 1\n", "unknown field `bogus`", 1, 1),
    ];
    for (src, want, line, column) in toml_cases {
        let err = RulesConfig::from_toml_str(src).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{want:?} in {text}");
        assert_eq!(
            (err.line(), err.column()),
            (Some(line), Some(column)),
            "{text}"
        );
        assert!(
            text.starts_with(&format!("line {line}, column {column}: ")),
            "{text}"
        );
    }

    let yaml_cases = [
        (
            "rules:\n  - name: a\n    key: everyone\n    quota: 10/5 weeks\n",
            "rules[0].quota: invalid quota \"10/5 weeks\"",
            4,
            12,
        ),
        (
            "rules:\n  - name: a\n    key: globl\n    quota: 1/s\n",
            "rules[0].key: unknown key source \"globl\"",
            3,
            10,
        ),
        (
            "rules:\n  - name: a\n    key: everyone\n    quota: 1/s\n    scope: everywhere\n",
            "rules[0].scope: unknown variant `everywhere`",
            5,
            12,
        ),
        (
            "rules:\n  - name: a\n    key: everyone\n    quota: 1/s\n    shadow: true\n    colour: red\n",
            "unknown field `colour`",
            6,
            5,
        ),
    ];
    for (src, want, line, column) in yaml_cases {
        let err = RulesConfig::from_yaml_str(src).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{want:?} in {text}");
        assert_eq!(
            (err.line(), err.column()),
            (Some(line), Some(column)),
            "{text}"
        );
    }
}

#[test]
fn files_by_extension() {
    let dir = std::env::temp_dir().join(format!("krl-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (toml, yaml) = (dir.join("limits.toml"), dir.join("limits.yaml"));
    std::fs::write(&toml, TOML).unwrap();
    std::fs::write(&yaml, YAML).unwrap();
    let names = |p| {
        RulesConfig::from_path(p)
            .unwrap()
            .rule_names()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&toml), ["dark-launch", "per-key", "per-tenant"]);
    assert_eq!(names(&yaml), ["per-client", "everyone"]);
    std::fs::write(&yaml, "rules: []\nextra: 1\n").unwrap();
    let err = RulesConfig::from_path(&yaml).unwrap_err();
    assert_eq!(err.path(), Some(yaml.as_path()));
    assert!(
        err.to_string()
            .starts_with(&format!("{}:2:1: unknown field `extra`", yaml.display())),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The code block after `heading` in docs/config.md, as the guide shows it.
fn guide_block(heading: &str, fence: &str) -> String {
    const GUIDE: &str = include_str!("../../docs/config.md");
    let after = &GUIDE[GUIDE.find(heading).expect(heading)..];
    let start = after.find(fence).expect(fence) + fence.len();
    let body = &after[start..];
    body[..body.find("\n```").unwrap()]
        .trim_start_matches('\n')
        .to_owned()
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

/// The errors the guide shows are what the crate prints.
#[test]
fn the_guides_errors_are_real_output() {
    let dir = std::env::temp_dir().join(format!("krl-guide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("limits.toml");
    std::fs::write(
        &file,
        "[[rules]]\nname = \"api\"\nkey = \"everyone\"\nquota = \"100/fortnight\"\n",
    )
    .unwrap();
    let e = RulesConfig::from_path(&file).unwrap_err();
    // As `from_path("limits.toml")` from `dir` prints it: the path as given.
    let shown = e.to_string().replace(&format!("{}/", dir.display()), "");
    let yaml = RulesConfig::from_yaml_str(
        "rules:\n  - name: a\n    key: everyone\n    quota: 10/5 weeks\n",
    )
    .unwrap_err()
    .to_string();
    let duplicate = RulesConfig::from_toml_str(
        "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"5/min\"\n[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"9/min\"\n",
    )
    .unwrap()
    .into_layer(&Registry::new())
    .unwrap_err()
    .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(guide_block("# Errors", "```text\n"), shown);
    assert_eq!(guide_block(&shown, "```text\n"), yaml);
    assert_eq!(guide_block(&yaml, "```text\n"), duplicate);
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
