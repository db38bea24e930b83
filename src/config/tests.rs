//! Reading and building rule files, end to end.

use super::{ConfigError, Registry, RulesConfig};
use crate::key::KeyExtractor;
use crate::quota::Quota;

fn toml_err(src: &str) -> ConfigError {
    RulesConfig::from_toml_str(src).unwrap_err()
}

#[test]
fn toml_positions() {
    let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"5/min\"\nbrust = 3\n");
    assert_eq!((e.line(), e.column()), (Some(5), Some(1)));
    assert!(e.message().contains("unknown field `brust`"), "{e}");
    let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"ip\"\nquota = \"5/min\"\n");
    assert_eq!((e.line(), e.column()), (Some(3), Some(7)));
}

#[test]
fn yaml_positions() {
    let e = RulesConfig::from_yaml_str(
        "rules:\n  - name: a\n    key: everyone\n    quota: 5/fortnight\n",
    )
    .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(4), Some(12)));
    assert!(
        e.message().starts_with("rules[0].quota: invalid quota"),
        "{e}"
    );
}

#[test]
fn calendar_quotas() {
    let config = RulesConfig::from_toml_str(
        "[[rules]]\nname = \"m\"\nkey = \"everyone\"\nquota = \"9/calendar_month\"\nutc_offset = \"-08:00\"\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    let q = layer.rules()[0].static_quota();
    assert_eq!(
        q,
        Some(Quota::per_calendar_month(9).with_utc_offset(-8 * 3600))
    );
    let e = toml_err(
        "[[rules]]\nname = \"m\"\nkey = \"everyone\"\nquota = \"9/min\"\nutc_offset = \"+01:00\"\n",
    );
    assert!(
        e.message().contains("a UTC offset needs a calendar quota"),
        "{e}"
    );
    assert_eq!(e.line(), Some(1));
    let e = toml_err(
        "[[rules]]\nname = \"m\"\nkey = \"everyone\"\nquota = \"9/calendar_day\"\nutc_offset = \"+1:00\"\n",
    );
    assert_eq!((e.line(), e.column()), (Some(5), Some(14)), "{e}");
    let config = RulesConfig::from_yaml_str(
        "rules:\n  - name: a\n    key: everyone\n    quota: 50/aligned_15min\n    utc_offset: \"+05:30\"\n",
    )
    .unwrap();
    let layer = config.into_layer(&Registry::new()).unwrap();
    assert_eq!(
        layer.rules()[0].static_quota(),
        Some(Quota::aligned(50, std::time::Duration::from_secs(900)).with_utc_offset(19_800))
    );
    let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"9/aligned_1500ms\"\n");
    assert!(e.message().contains("whole seconds"), "{e}");
    assert_eq!((e.line(), e.column()), (Some(4), Some(9)), "{e}");
}

#[test]
fn rule_checks() {
    let base = "[[rules]]\nname = \"a\"\nkey = \"everyone\"\n";
    let cases = [
        ("", "missing field `quota` (or `quota_fn`)"),
        ("quota = \"1/s\"\nquota_fn = \"p\"\n", "not both"),
        (
            "quota_fn = \"p\"\nburst = 3\n",
            "`burst` needs a static `quota`",
        ),
        ("quota = \"1/s\"\nburst = 0\n", "the burst is zero"),
        (
            "quota = \"1/s\"\ntimeout = \"5ms\"\n",
            "`timeout` only applies",
        ),
        (
            "quota = \"1/s\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
            "needs a `client_ip` key",
        ),
    ];
    for (extra, want) in cases {
        let e = toml_err(&format!("{base}{extra}"));
        assert!(e.message().contains(want), "{want}: {e}");
        assert!(e.message().contains("rule \"a\""), "{e}");
        assert!(e.line().is_some(), "{e}");
    }
    let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"client_ip\"\nquota = \"1/s\"\n");
    assert!(e.message().contains("needs `trusted_proxies`"), "{e}");
}

#[test]
fn registry_errors() {
    let cfg = |s: &str| RulesConfig::from_toml_str(s).unwrap();
    let e = cfg("[[rules]]\nname = \"a\"\nkey = \"extension:user\"\nquota = \"1/s\"\n")
        .into_builder(&Registry::new().key("tenant", KeyExtractor::everyone()))
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "line 2, column 1: rule \"a\": `key`: the registry has no \"user\" (it has: tenant)\n  2 | name = \"a\""
    );
    let e =
        cfg("[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nscope = \"global\"\n")
            .into_builder(&Registry::new())
            .err()
            .unwrap();
    assert!(e.to_string().contains("needs a Redis backend"), "{e}");
    let e = cfg("[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"1/s\"\nalgorithm = \"fixed_window\"\n")
        .into_layer(&Registry::new())
        .unwrap_err();
    assert!(e.to_string().contains("fixed_window needs a global"), "{e}");
}

/// Checks made when the layer is built point at the rule in the file, as
/// syntax errors do.
#[test]
fn build_errors_carry_the_rules_line() {
    let reg = Registry::new();
    let dup = "[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"5/min\"\n\n[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"9/min\"\n";
    let e = RulesConfig::from_toml_str(dup)
        .unwrap()
        .into_layer(&reg)
        .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(7), Some(1)), "the second `a`");
    assert!(e.message().starts_with("two rules are named \"a\""), "{e}");

    let cost = "rules:\n  - name: big\n    key: everyone\n    quota: 5/min\n    cost: 30\n";
    let e = RulesConfig::from_yaml_str(cost)
        .unwrap()
        .into_layer(&reg)
        .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(2), Some(5)));
    assert_eq!(
        e.to_string(),
        "line 2, column 5: rule \"big\": a cost of 30 is above the 5 the quota admits at once\n  2 |   - name: big"
    );
    // What `fn main() -> Result<(), ConfigError>` prints is the same.
    assert_eq!(format!("{e:?}"), e.to_string());
}

#[test]
fn exemptions_and_near_limit() {
    let src = "exempt_fn = \"health\"\n\n[[rules]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"10/s\"\nexempt_ips = [\"10.0.0.0/8\", \"::1\"]\nnear_limit_ratio = 0.1\n\n[[rules]]\nname = \"all\"\nkey = \"everyone\"\nquota = \"100/s\"\nexempt_fn = \"health\"\nnear_limit_ratio = false\n";
    let registry = Registry::new().exempt_fn("health", |p| p.uri.path() == "/healthz");
    let layer = RulesConfig::from_toml_str(src)
        .unwrap()
        .into_layer(&registry)
        .unwrap();
    let d = layer.describe();
    assert!(d.layer_exempt());
    assert_eq!(
        d.rules()[0].on_deny,
        "429 + Retry-After, exempt: 10.0.0.0/8 + ::1, near limit < 10%"
    );
    assert_eq!(
        d.rules()[1].on_deny,
        "429 + Retry-After, exempt: fn, near limit off"
    );
    let yaml = RulesConfig::from_yaml_str(
        "rules:\n  - name: a\n    key: peer_ip\n    quota: 5/min\n    exempt_ips: [10.0.0.0/8]\n    near_limit_ratio: 1\n",
    )
    .unwrap();
    assert!(yaml.into_layer(&Registry::new()).is_ok());

    let e = toml_err(
        "[[rules]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"5/min\"\nexempt_ips = [\"10.0.0.0/33\"]\n",
    );
    assert!(
        e.message()
            .contains("`exempt_ips`: \"10.0.0.0/33\" is not a CIDR or IP address"),
        "{e}"
    );
    assert_eq!(e.line(), Some(1));
    let e = toml_err(
        "[[rules]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"5/min\"\nnear_limit_ratio = 1.5\n",
    );
    assert_eq!((e.line(), e.column()), (Some(5), Some(20)));
    assert!(e.message().contains("invalid near_limit_ratio 1.5"), "{e}");
    let e = toml_err(
        "[[rules]]\nname = \"a\"\nkey = \"peer_ip\"\nquota = \"5/min\"\nnear_limit_ratio = true\n",
    );
    assert_eq!(e.line(), Some(5));
    let e = RulesConfig::from_toml_str(
        "max_key_len = 64\nexempt_fn = \"nope\"\n[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"5/min\"\n",
    )
    .unwrap()
    .into_layer(&Registry::new())
    .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(2), Some(1)));
    assert!(
        e.message()
            .contains("`exempt_fn`: the registry has no \"nope\""),
        "{e}"
    );
}

/// `[[bandwidth]]` entries build by name; their errors point at them.
#[test]
fn bandwidth_entries() {
    let reg = Registry::new();
    let src = "[[rules]]\nname = \"dl\"\nkey = \"everyone\"\nquota = \"5/min\"\n\n[[bandwidth]]\nname = \"dl\"\nkey = \"header:x-key\"\nbytes_per_second = 1000\ndirection = \"both\"\n\n[[bandwidth]]\nname = \"zero\"\nkey = \"everyone\"\nbytes_per_second = 0\n";
    let config = RulesConfig::from_toml_str(src).unwrap();
    assert_eq!(config.bandwidth_names().collect::<Vec<_>>(), ["dl", "zero"]);
    let dl = config.bandwidth_layer("dl", &reg).unwrap();
    assert_eq!(dl.direction(), crate::bandwidth::Direction::Both);
    assert_eq!((dl.bytes_per_second(), dl.burst()), (1000, 1000));
    let e = config.bandwidth_layer("zero", &reg).unwrap_err();
    assert_eq!(e.line(), Some(13), "{e}");
    assert!(config.bandwidth_layer("nope", &reg).is_err());
    let e = toml_err(
        "rules = []\n[[bandwidth]]\nname = \"x\"\nkey = \"everyone\"\nbytes_per_second = 1\nrate = 2\n",
    );
    assert!(e.to_string().contains("unknown field `rate`"), "{e}");
    let local = "rules = []\n[[bandwidth]]\nname = \"x\"\nkey = \"everyone\"\nbytes_per_second = 1\ntimeout = \"1s\"\n";
    let e = RulesConfig::from_toml_str(local)
        .unwrap()
        .bandwidth_layer("x", &reg)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("only applies to `scope = \"global\"`"),
        "{e}"
    );
}
