//! envoyproxy/ratelimit's own test configurations (vendored under
//! `envoyproxy_ratelimit/`, see its README): each file loads or is refused
//! as `config_test.go` expects, and the limits its `GetLimit` finds for
//! `wildcard.yaml` (mid-string and multiple wildcards) and
//! `share_threshold.yaml` (one counter for every value a wildcard matches)
//! are the ones `ShouldRateLimit` answers with, read by checks
//! (`hits_addend: 0`).

use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use keyed_rls::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use keyed_rls::{RateLimitServer, RlsConfig};

use crate::{client, descriptor, serve};

fn file(name: &str) -> String {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/rls/envoyproxy_ratelimit"
    );
    std::fs::read_to_string(format!("{dir}/{name}")).unwrap()
}

#[test]
fn its_files_load_and_are_refused_as_it_does() {
    for name in [
        "basic_config.yaml",
        "merge_domain_key1.yaml",
        "merge_domain_key2.yaml",
        "metadata.yaml",
        "shadowmode_config.yaml",
        "share_threshold.yaml",
        "wildcard.yaml",
    ] {
        if let Err(e) = RlsConfig::from_yaml_str(&file(name)) {
            panic!("{name} loads there: {e}");
        }
    }
    // What config_test.go expects each refusal to say, in our words.
    for (name, says) in [
        ("bad_limit_unit.yaml", "invalid rate limit unit \"foo\""),
        ("bad_yaml.yaml", "line"),
        (
            "duplicate_key.yaml",
            "\"test-domain.key1_value1\" is defined twice",
        ),
        ("empty_domain.yaml", "domain"),
        ("empty_key.yaml", "`key`"),
        ("misspelled_key.yaml", "unknown field `ratelimit`"),
        ("misspelled_key2.yaml", "unknown field `requestsperunit`"),
        ("non_map_list.yaml", "descriptors"),
        ("non_string_key.yaml", "domain"),
        ("replaces_empty.yaml", "an empty `replaces` name"),
        ("replaces_self.yaml", "`replaces` names the limit itself"),
        (
            "unlimited_with_unit.yaml",
            "an `unlimited` limit takes no `unit`",
        ),
    ] {
        match RlsConfig::from_yaml_str(&file(name)) {
            Ok(_) => panic!("{name} is refused there"),
            Err(e) => assert!(e.to_string().contains(says), "{name}: {e}"),
        }
    }
    // Two files of one domain: refused (MERGE_DOMAIN_CONFIG off), as there.
    let basic = RlsConfig::from_yaml_str(&file("basic_config.yaml")).unwrap();
    let again = RlsConfig::from_yaml_str(&file("duplicate_domain.yaml")).unwrap();
    let e = basic.merge(again).unwrap_err();
    assert!(e.to_string().contains("test-domain"), "{e}");
}

/// `MERGE_DOMAIN_CONFIG` on: its two files of one domain serve both keys,
/// and a top-level descriptor in both is refused.
#[tokio::test]
async fn merged_domains_hold_both_files_descriptors() {
    let one = RlsConfig::from_yaml_str(&file("merge_domain_key1.yaml")).unwrap();
    let two = RlsConfig::from_yaml_str(&file("merge_domain_key2.yaml")).unwrap();
    let e = one.clone().merge_domains(one.clone()).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"test-domain.key1_value1\" is defined twice"),
        "{e}"
    );
    let both = one.merge_domains(two).unwrap();
    let mut c = client(serve(RateLimitServer::builder(both).build().unwrap()).await).await;
    assert_eq!(check(&mut c, &[("key1", "value1")]).await, (10, 10));
    assert_eq!(check(&mut c, &[("key2", "value2")]).await, (20, 20));
}

/// A check of one descriptor: its limit's `requests_per_unit` (0: no limit)
/// and what is left.
async fn check(
    c: &mut keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>,
    entries: &[(&str, &str)],
) -> (u32, u32) {
    let mut d: RateLimitDescriptor = descriptor(entries);
    d.hits_addend = Some(0);
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "test-domain".into(),
            descriptors: vec![d],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let s = &r.statuses[0];
    (
        s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
        s.limit_remaining,
    )
}

#[tokio::test]
async fn its_wildcards_match_as_its_get_limit_does() {
    let config = RlsConfig::from_yaml_str(&file("wildcard.yaml")).unwrap();
    let mut c = client(serve(RateLimitServer::builder(config).build().unwrap()).await).await;
    for (key, value, limit) in [
        ("noVal", "foo1", 20),
        ("wild", "foo1", 20),
        ("wild", "foo2", 20),
        ("wild", "bar", 0),
        ("noWild", "foo1", 0),
        ("midWild", "barab", 20),
        ("midWild", "bar123b", 20),
        ("midWild", "barb", 20),
        ("midWild", "bara", 0),
        ("midWild", "xbarb", 0),
        ("multiWild", "foo123bar456baz", 10),
        ("multiWild", "foobarbaz", 10),
        ("multiWild", "foo123baz", 0),
        ("multiWild", "bar456baz", 0),
    ] {
        assert_eq!(
            check(&mut c, &[(key, value)]).await.0,
            limit,
            "{key}={value}"
        );
    }
    let nested = check(&mut c, &[("nestedWild", "val1"), ("wild", "goo2")]).await;
    assert_eq!(nested.0, 20);
}

#[tokio::test]
async fn share_threshold_counts_every_matching_value_in_one_counter() {
    let config = RlsConfig::from_yaml_str(&file("share_threshold.yaml")).unwrap();
    let server = RateLimitServer::builder(config).build().unwrap();
    let mut c = client(serve(server).await).await;
    let spend = |v: &'static str| {
        let d = descriptor(&[("files", v)]);
        RateLimitRequest {
            domain: "test-domain".into(),
            descriptors: vec![d],
            hits_addend: 0,
        }
    };
    for v in ["files/a.txt", "files/b.txt", "files/c/d.txt"] {
        c.should_rate_limit(spend(v)).await.unwrap();
    }
    // 100 a minute, shared: every value under files/* spent the same.
    assert_eq!(check(&mut c, &[("files", "files/zzz")]).await, (100, 97));
    // Nested under a shared wildcard, both levels shared: 300 a minute.
    let deep = [("files", "top/x"), ("files", "nested/y")];
    assert_eq!(check(&mut c, &deep).await.0, 300);
}
