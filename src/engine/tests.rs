//! The chain, compiled and evaluated without a server.

use std::sync::atomic::{AtomicUsize, Ordering};

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;

use super::rule::Store;
use super::{Chain, ChainConfig, Suspended};
use crate::decision::Decisions;
use crate::error::BuildError;
use crate::quota::QuotaError;
use crate::{
    algorithm::Algorithm, decision::Decision, decision::Source, key::Key, key::KeyExtractor,
    key::OnMissingKey, quota::Quota, rule::Rule,
};

fn config() -> ChainConfig {
    ChainConfig {
        instances: None,
        max_key_len: crate::key::DEFAULT_MAX_KEY_LEN,
        cleanup_every: Duration::from_secs(60),
        refunds: true,
    }
}

fn chain(rules: Vec<Rule>) -> Arc<Chain> {
    match Chain::compile(rules, config(), true, None) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("compile: {e}"),
    }
}

fn compile_err(rules: Vec<Rule>) -> BuildError {
    Chain::compile(rules, config(), true, None)
        .err()
        .expect("compile should fail")
}

fn parts(key: Option<&str>) -> Parts {
    let mut b = http::Request::builder().uri("/");
    if let Some(k) = key {
        b = b.header("x-key", k);
    }
    b.body(()).unwrap().into_parts().0
}

fn by_key(name: &str, quota: Quota) -> Rule {
    Rule::new(name, KeyExtractor::header("x-key"), quota)
}

fn everyone(name: &str, quota: Quota) -> Rule {
    Rule::new(name, KeyExtractor::everyone(), quota)
}

/// The `x-key` header, found only after an await.
fn async_by_key(name: &str, quota: Quota) -> Rule {
    let key = KeyExtractor::new_async("async", |p: &Parts| {
        let k = p
            .headers
            .get("x-key")
            .map(|v| Key::copy_from_slice(v.as_bytes()));
        async move {
            tokio::task::yield_now().await;
            k
        }
    });
    Rule::new(name, key, quota)
}

/// A verdict with the decisions it rests on, as the tests read it.
enum Expect {
    Allow(Decisions),
    Deny(Decisions),
    Reject {
        rule: Arc<str>,
        status: StatusCode,
        decisions: Decisions,
    },
}

fn verdict(v: super::Verdict, decisions: Decisions) -> Expect {
    match v {
        super::Verdict::Allow(_) => Expect::Allow(decisions),
        super::Verdict::Deny(_) => Expect::Deny(decisions),
        super::Verdict::Reject { rule, status, .. } => Expect::Reject {
            rule,
            status,
            decisions,
        },
    }
}

fn eval(chain: &Arc<Chain>, parts: &Parts) -> Expect {
    let mut decisions = Decisions::new();
    match chain.evaluate(parts, &mut decisions) {
        Ok(v) => verdict(v, decisions),
        Err(_) => panic!("evaluation suspended"),
    }
}

/// An evaluation that must suspend.
fn suspend(chain: &Arc<Chain>, parts: &Parts) -> Box<Suspended> {
    match chain.evaluate(parts, &mut Decisions::new()) {
        Ok(_) => panic!("an async key must suspend"),
        Err(s) => s,
    }
}

async fn resume(s: Box<Suspended>, parts: Parts) -> (Parts, Expect) {
    let (p, d, v) = s.resume(parts).await;
    (p, verdict(v, d))
}

fn allowed(v: Expect) -> Decisions {
    match v {
        Expect::Allow(d) => d,
        other => panic!("expected Allow, got {}", summary(&other).0),
    }
}

fn denied(v: Expect) -> Decisions {
    match v {
        Expect::Deny(d) => d,
        other => panic!("expected Deny, got {}", summary(&other).0),
    }
}

/// The verdict's kind and, per decision, the rule, allowed and remaining:
/// what does not depend on the clock.
fn summary(v: &Expect) -> (String, Vec<(String, bool, u32)>) {
    let (kind, ds) = match v {
        Expect::Allow(d) => ("allow".to_owned(), d),
        Expect::Deny(d) => ("deny".to_owned(), d),
        Expect::Reject {
            rule,
            status,
            decisions,
            ..
        } => (format!("reject {rule} {}", status.as_u16()), decisions),
    };
    let ds = ds
        .iter()
        .map(|d| {
            (
                d.rule.to_string(),
                d.decision.is_allowed(),
                d.decision.remaining(),
            )
        })
        .collect();
    (kind, ds)
}

fn names(ds: &Decisions) -> Vec<&str> {
    ds.iter().map(|d| &*d.rule).collect()
}

/// Keys held by rule `i`'s local store.
fn keys(chain: &Chain, i: usize) -> usize {
    match &chain.rules[i].store {
        Store::Local(l) => l.len(),
        #[cfg(feature = "redis")]
        Store::Global(_) => unreachable!("local rules only"),
    }
}

#[test]
fn every_rule_is_evaluated_in_order_when_all_allow() {
    let c = chain(vec![
        by_key("first", Quota::per_minute(5)),
        everyone("second", Quota::per_minute(10)),
    ]);
    let ds = allowed(eval(&c, &parts(Some("a"))));
    assert_eq!(names(&ds), ["first", "second"]);
    assert_eq!(ds[0].decision.remaining(), 4);
    assert_eq!(ds[1].decision.remaining(), 9);
    assert!(ds.iter().all(|d| d.source == Source::Local && !d.shadow));
}

#[test]
fn the_first_deny_ends_evaluation() {
    let c = chain(vec![
        everyone("open", Quota::per_minute(10)),
        by_key("tight", Quota::per_minute(1)),
        everyone("later", Quota::per_minute(10)),
    ]);
    let p = parts(Some("a"));
    assert_eq!(allowed(eval(&c, &p)).len(), 3);
    let ds = denied(eval(&c, &p));
    assert_eq!(names(&ds), ["open", "tight"]);
    let last = ds.last().unwrap();
    assert!(!last.decision.is_allowed());
    assert!(last.decision.retry_after().is_some());
    // "later" saw only the first request; "open" got the denied
    // request's unit back.
    let ds = allowed(eval(&c, &parts(Some("b"))));
    assert_eq!(names(&ds), ["open", "tight", "later"]);
    assert_eq!(ds[0].decision.remaining(), 8);
    assert_eq!(ds[2].decision.remaining(), 8);
}

#[test]
fn a_deny_leaves_later_buckets_untouched() {
    let costs = Arc::new(AtomicUsize::new(0));
    let seen = costs.clone();
    let c = chain(vec![
        everyone("none-left", Quota::per_minute(1)),
        by_key("later", Quota::per_minute(10)).cost_fn(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
            1
        }),
    ]);
    allowed(eval(&c, &parts(Some("a"))));
    denied(eval(&c, &parts(Some("b"))));
    denied(eval(&c, &parts(Some("c"))));
    assert_eq!(keys(&c, 1), 1, "only the first key was counted");
    assert_eq!(costs.load(Ordering::Relaxed), 1);
}

#[test]
fn a_shadow_deny_is_recorded_and_evaluation_goes_on() {
    let c = chain(vec![
        everyone("trial", Quota::per_minute(1)).shadow(true),
        everyone("enforced", Quota::per_minute(10)),
    ]);
    let p = parts(None);
    allowed(eval(&c, &p));
    let ds = allowed(eval(&c, &p));
    assert_eq!(names(&ds), ["trial", "enforced"]);
    assert!(ds[0].shadow);
    assert!(!ds[0].decision.is_allowed());
    assert!(!ds[1].shadow);
    assert_eq!(ds[1].decision.remaining(), 8);
}

#[test]
fn a_zero_cost_skips_the_rule() {
    let c = chain(vec![
        everyone("free", Quota::per_minute(1)).cost_fn(|_| 0),
        everyone("fixed-free", Quota::per_minute(1)).cost(0),
        everyone("paid", Quota::per_minute(10)),
    ]);
    for _ in 0..3 {
        assert_eq!(names(&allowed(eval(&c, &parts(None)))), ["paid"]);
    }
    assert_eq!((keys(&c, 0), keys(&c, 1)), (0, 0));
}

#[test]
fn a_cost_above_the_burst_is_denied_without_retry_after() {
    let c = chain(vec![
        everyone("bytes", Quota::per_minute(10).with_burst(4)).cost_fn(|p| {
            p.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }),
    ]);
    let mut p = parts(None);
    p.headers.insert("x-cost", "5".parse().unwrap());
    let ds = denied(eval(&c, &p));
    let d = ds[0].decision;
    assert_eq!(d, Decision::never(10, Duration::from_secs(60)));
    assert_eq!(d.retry_after(), None);
    assert_eq!(keys(&c, 0), 0, "the bucket was not touched");
    // The whole burst is still there.
    p.headers.insert("x-cost", "4".parse().unwrap());
    let ds = allowed(eval(&c, &p));
    assert_eq!(ds[0].decision.remaining(), 0);
}

#[test]
fn a_request_time_quota_that_admits_nothing_is_denied_without_retry_after() {
    let c = chain(vec![
        everyone("plan", Quota::per_minute(10)).quota_fn(|_| Quota::per_minute(0)),
    ]);
    let ds = denied(eval(&c, &parts(None)));
    assert_eq!(ds[0].decision, Decision::never(0, Duration::from_secs(60)));
    assert_eq!(keys(&c, 0), 0);
}

#[test]
fn a_missing_key_is_rejected_with_the_rules_status() {
    let c = chain(vec![
        everyone("open", Quota::per_minute(10)),
        by_key("auth", Quota::per_minute(10))
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
        everyone("later", Quota::per_minute(10)),
    ]);
    match eval(&c, &parts(None)) {
        Expect::Reject {
            rule,
            status,
            decisions,
        } => {
            assert_eq!(&*rule, "auth");
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert_eq!(names(&decisions), ["open"]);
        }
        other => panic!("expected Reject, got {}", summary(&other).0),
    }
    assert_eq!(keys(&c, 2), 0);
    let ds = allowed(eval(&c, &parts(Some("a"))));
    assert_eq!(names(&ds), ["open", "auth", "later"]);
}

#[test]
fn a_missing_key_skips_the_rule_by_default() {
    let c = chain(vec![
        by_key("per-key", Quota::per_minute(1)).on_missing_key(OnMissingKey::Skip),
        everyone("all", Quota::per_minute(10)),
    ]);
    for _ in 0..3 {
        assert_eq!(names(&allowed(eval(&c, &parts(None)))), ["all"]);
    }
    assert_eq!(keys(&c, 0), 0);
}

#[test]
fn a_missing_key_counts_against_the_fallback() {
    let c = chain(vec![
        by_key("per-key", Quota::per_minute(1))
            .on_missing_key(OnMissingKey::Fallback(KeyExtractor::everyone())),
    ]);
    allowed(eval(&c, &parts(None)));
    denied(eval(&c, &parts(None)));
    allowed(eval(&c, &parts(Some("a"))));
}

#[test]
fn policies_are_rendered_only_when_asked() {
    let rules = || vec![everyone("api", Quota::per_minute(10))];
    let ds = allowed(eval(&chain(rules()), &parts(None)));
    assert_eq!(ds[0].quota_member.as_ref().unwrap(), "\"api\";q=10;w=60");
    let c = Arc::new(Chain::compile(rules(), config(), false, None).ok().unwrap());
    assert_eq!(allowed(eval(&c, &parts(None)))[0].quota_member, None);
}

#[test]
fn a_split_rule_enforces_its_share() {
    let cfg = ChainConfig {
        instances: Some(2),
        ..config()
    };
    let rule = everyone("split", Quota::per_minute(10)).split_across_instances(true);
    let c = Arc::new(Chain::compile(vec![rule], cfg, true, None).ok().unwrap());
    let ds = allowed(eval(&c, &parts(None)));
    assert_eq!((ds[0].decision.limit(), ds[0].decision.remaining()), (5, 4));
}

#[tokio::test]
async fn an_async_key_suspends_and_resume_gives_the_sync_verdict() {
    let rules = |async_key: bool| {
        let middle = if async_key {
            async_by_key("per-key", Quota::per_minute(2))
        } else {
            by_key("per-key", Quota::per_minute(2))
        };
        vec![
            everyone("before", Quota::per_minute(10)),
            middle.on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
            everyone("after", Quota::per_minute(10)),
        ]
    };
    let (sync, slow) = (chain(rules(false)), chain(rules(true)));
    let requests = [Some("a"), Some("a"), Some("a"), None, Some("b")];
    let (mut kinds, mut last) = (Vec::new(), Vec::new());
    for key in requests {
        let expected = summary(&eval(&sync, &parts(key)));
        let s = suspend(&slow, &parts(key));
        // Stopped at the async rule, after the first rule's decision.
        assert_eq!(s.next, 2);
        assert_eq!(names(&s.decisions), ["before"]);
        let (p, v) = resume(s, parts(key)).await;
        assert_eq!(p.headers.get("x-key").is_some(), key.is_some());
        let got = summary(&v);
        assert_eq!(got, expected);
        kinds.push(got.0);
        last = got.1;
    }
    // "after" saw neither the deny nor the reject.
    assert_eq!(last[2], ("after".to_owned(), true, 7));
    assert_eq!(
        kinds,
        ["allow", "allow", "deny", "reject per-key 401", "allow"]
    );
}

#[tokio::test]
async fn resume_goes_on_with_sync_rules_after_the_async_one() {
    let c = chain(vec![
        async_by_key("per-key", Quota::per_minute(5)),
        everyone("after", Quota::per_minute(1)),
    ]);
    let s = suspend(&c, &parts(Some("a")));
    assert_eq!((s.next, s.decisions.len()), (1, 0));
    let (_, v) = resume(s, parts(Some("a"))).await;
    assert_eq!(names(&allowed(v)), ["per-key", "after"]);
    let s = suspend(&c, &parts(Some("a")));
    let (_, v) = resume(s, parts(Some("a"))).await;
    let ds = denied(v);
    assert_eq!(names(&ds), ["per-key", "after"]);
    assert_eq!(ds[0].decision.remaining(), 3);
}

#[test]
fn compile_needs_a_rule() {
    assert_eq!(compile_err(vec![]), BuildError::NoRules);
}

#[test]
fn compile_rejects_duplicate_names() {
    let err = compile_err(vec![
        everyone("api", Quota::per_minute(1)),
        everyone("other", Quota::per_minute(1)),
        by_key("api", Quota::per_minute(2)),
    ]);
    assert_eq!(err, BuildError::DuplicateRule("api".into()));
}

#[test]
fn compile_rejects_invalid_names() {
    for name in ["", "tab\there", "naïve"] {
        let err = compile_err(vec![everyone(name, Quota::per_minute(1))]);
        assert_eq!(err, BuildError::InvalidRuleName(name.into()));
    }
}

#[test]
fn compile_rejects_a_quota_that_admits_nothing() {
    let err = compile_err(vec![everyone("api", Quota::per_minute(0))]);
    assert_eq!(
        err,
        BuildError::InvalidQuota {
            rule: "api".into(),
            error: QuotaError::ZeroLimit,
        }
    );
    let err = compile_err(vec![everyone("api", Quota::per_minute(5).with_burst(0))]);
    assert!(matches!(
        err,
        BuildError::InvalidQuota {
            error: QuotaError::ZeroBurst,
            ..
        }
    ));
}

#[test]
fn compile_rejects_a_fixed_cost_above_the_burst() {
    let err = compile_err(vec![
        everyone("api", Quota::per_minute(10).with_burst(3)).cost(4),
    ]);
    assert_eq!(
        err,
        BuildError::CostAboveCapacity {
            rule: "api".into(),
            cost: 4,
            capacity: 3,
        }
    );
    // The burst itself is fine.
    chain(vec![
        everyone("api", Quota::per_minute(10).with_burst(3)).cost(3),
    ]);
}

#[test]
fn compile_rejects_window_algorithms_on_local_rules() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let err = compile_err(vec![
            everyone("api", Quota::per_minute(10)).algorithm(algorithm),
        ]);
        assert_eq!(
            err,
            BuildError::AlgorithmNotLocal {
                rule: "api".into(),
                algorithm,
            }
        );
    }
    chain(vec![
        everyone("api", Quota::per_minute(10)).algorithm(Algorithm::TokenBucket),
    ]);
}

#[test]
fn compile_checks_a_fixed_cost_against_a_split_share() {
    let rule = Rule::new("split", KeyExtractor::everyone(), Quota::per_second(10))
        .cost(5)
        .split_across_instances(true);
    let cfg = ChainConfig {
        instances: Some(3),
        ..config()
    };
    let err = Chain::compile(vec![rule], cfg, true, None)
        .err()
        .expect("5 > 10 / 3");
    assert!(
        matches!(
            err,
            BuildError::CostAboveCapacity {
                cost: 5,
                capacity: 4,
                ..
            }
        ),
        "{err}"
    );
}
