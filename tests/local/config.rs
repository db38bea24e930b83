//! Rules from TOML and YAML files with local rules, driven over real HTTP,
//! and the errors bad files give (their global rules: tests/redis/config.rs).

use std::time::Duration;

use crate::support::{
    CONFIG_TOML as TOML, get_with, guide_block, header, ok_app, serve, statuses_with,
};

use keyed_rate_limit::{Registry, RulesConfig};

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
    let url = serve(ok_app(layer)).await;

    // Clients behind the trusted proxy (the test's own 127.0.0.1) count apart.
    let one = [("x-forwarded-for", "198.51.100.1")];
    let res = get_with(&url, &one).await;
    assert_eq!(header(&res, "x-ratelimit-limit").as_deref(), Some("2"));
    assert!(
        !res.headers().contains_key("ratelimit-policy"),
        "legacy only"
    );
    assert_eq!(statuses_with(&url, &one, 2).await, [200, 429]);

    // A second client has its own 2, but "everyone" (6 units at cost 2) has 1 request left.
    let two = [("x-forwarded-for", "198.51.100.2")];
    assert_eq!(statuses_with(&url, &two, 2).await, [200, 429]);
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

/// `blockable` in a rule file lets the control handle block the rule's
/// keys, and `describe()` says so.
#[tokio::test]
async fn a_blockable_rule_from_the_file_can_be_blocked() {
    let config = RulesConfig::from_toml_str(
        "[[rules]]\nname = \"api\"\nkey = \"header:x-user\"\nquota = \"5/min\"\nblockable = true\n\n[[rules]]\nname = \"plain\"\nkey = \"header:x-user\"\nquota = \"5/min\"\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    assert!(layer.rules()[0].is_blockable() && !layer.rules()[1].is_blockable());
    assert_eq!(
        layer.describe().rules()[0].on_deny,
        "429 + Retry-After, blockable"
    );
    let control = layer.control();
    control
        .block("api", "u", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(!control.peek("api", "u").await.unwrap().is_allowed());
    let err = control
        .block("plain", "u", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "rule \"plain\" is not blockable: set `blockable(true)` or a lockout"
    );
}

#[test]
fn invalid_configs_point_at_the_field() {
    #[allow(unused_mut)] // extended with the `redis` feature
    let mut toml_cases = vec![
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
        ("bogus = 1\n", "unknown field `bogus`", 1, 1),
    ];
    // Leases are checked where they run: with the `redis` feature.
    #[cfg(feature = "redis")]
    toml_cases.extend([
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
    ]);
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
