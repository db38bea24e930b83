//! Unit tests of a global rule's decision path (`Global`).

use super::*;
use crate::key::KeyExtractor;
use crate::policy::{FailureMode, LeasePolicy, Lockout};

const SECOND: Duration = Duration::from_secs(1);

fn rule(quota: Quota) -> Rule {
    Rule::new("r", KeyExtractor::everyone(), quota)
}

fn lockout() -> Lockout {
    Lockout::new(3, Duration::from_secs(60), Duration::from_secs(900))
}

/// 1000 a second, leased for 100 ms: Redis holds back 100 of the burst.
fn leasing() -> Rule {
    rule(Quota::per_second(1000)).lease(LeasePolicy::new(Duration::from_millis(100)))
}

/// `rule`'s runtime on a Redis it never reaches: enough for what it
/// decides without Redis.
async fn global(rule: &Rule) -> Global {
    let redis = RedisBackend::builder("redis://127.0.0.1:1")
        .connect_lazily()
        .without_live_instances()
        .build()
        .await
        .expect("a lazy backend builds without a server");
    Global::new(rule, redis, 1)
}

fn no_locks() -> Locks {
    Locks::new(Budget::new(100, KeySpaceFull::Refuse))
}

fn cost(units: u32) -> NonZeroU32 {
    NonZeroU32::new(units).unwrap()
}

#[test]
fn a_rule_reads_its_lock_only_when_it_can_be_locked() {
    let plain = rule(Quota::per_second(10));
    let read = |lockout| Locking {
        read: true,
        lockout,
    };
    assert_eq!(locks(&plain), Locking::default());
    assert_eq!(locks(&plain.clone().blockable(true)), read(None));
    let locking = plain.lockout(lockout());
    assert_eq!(locks(&locking), read(Some(lockout())));
    // A shadow reads its lock but never locks a key.
    assert_eq!(locks(&locking.shadow(true)), read(None));
}

#[test]
fn cached_denies_answer_unless_a_lockout_counts_every_deny() {
    let plain = rule(Quota::per_second(10));
    assert!(caches_denies(&plain));
    let locking = plain.lockout(lockout());
    assert!(!caches_denies(&locking));
    assert!(caches_denies(&locking.shadow(true)));
}

#[test]
fn an_allow_that_left_nothing_caches_the_next_requests_deny_at_any_cost() {
    let reset = Duration::from_millis(900);
    let d = Decision::allowed(10, SECOND, 0, reset);
    let wait = Duration::from_millis(100);
    let cached = deny_to_cache(&d, Some(wait), cost(3));
    let deny = Decision::denied(10, SECOND, wait, reset);
    assert_eq!(cached, Some((deny, NonZeroU32::MIN)));
}

#[test]
fn an_allow_with_room_forgets_the_key_and_a_deny_is_cached_for_its_cost() {
    let allowed = Decision::allowed(10, SECOND, 4, SECOND);
    assert_eq!(deny_to_cache(&allowed, None, cost(3)), None);
    let denied = Decision::denied(10, SECOND, Duration::from_millis(300), SECOND);
    assert_eq!(
        deny_to_cache(&denied, None, cost(3)),
        Some((denied, cost(3)))
    );
}

#[tokio::test]
async fn a_leasing_rule_is_counted_with_one_ttl_of_burst_held_back() {
    let r = leasing();
    let g = global(&r).await;
    let q = Quota::per_second(1000);
    let held = Quotas {
        shown: q,
        counted: q.with_burst(900),
    };
    assert_eq!(g.counted, Some(held), "the static quota's, computed once");
    assert_eq!(g.counted(&r, q), Some(q.with_burst(900)));
    // Another quota (a `quota_fn`'s) is converted as it comes.
    let other = Quota::per_second(100);
    assert_eq!(g.counted(&r, other), Some(other.with_burst(90)));
    assert_eq!(g.counting(&r, other), other.with_burst(90));
    // A calendar quota cannot keep the leases' bound: counted as it is.
    let day = Quota::per_calendar_day(100);
    assert_eq!((g.counted(&r, day), g.counting(&r, day)), (None, day));
}

#[tokio::test]
async fn an_exact_rule_is_counted_in_its_own_quota() {
    let r = rule(Quota::per_second(10));
    let g = global(&r).await;
    let q = Quota::per_second(10);
    assert_eq!(g.counted, None);
    assert_eq!((g.counted(&r, q), g.counting(&r, q)), (None, q));
    let Err(Asked::Exact(quotas)) = g.decide_now(&r, &no_locks(), &Key::from("k"), q, cost(1))
    else {
        panic!("a new key asks Redis for one exact decision");
    };
    assert_eq!(quotas, Quotas::same(q));
}

#[tokio::test]
async fn a_cost_above_the_leases_burst_is_never_admitted_and_redis_is_not_asked() {
    let r = leasing();
    let g = global(&r).await;
    let (q, key) = (Quota::per_second(1000), Key::from("k"));
    let Ok((d, source)) = g.decide_now(&r, &no_locks(), &key, q, cost(901)) else {
        panic!("decided without Redis");
    };
    assert_eq!((d, source), (Decision::never(1000, SECOND), Source::Global));
    let Err(Asked::Lease(lease)) = g.decide_now(&r, &no_locks(), &key, q, cost(900)) else {
        panic!("a cost that fits asks for a lease");
    };
    assert_eq!(lease.1.counted, q.with_burst(900));
    assert_eq!(lease.1.shown, q);
}

#[tokio::test]
async fn a_cached_deny_answers_without_redis_unless_a_lockout_counts_it() {
    let q = Quota::per_second(10);
    let key = Key::from("k");
    let deny = Decision::denied(10, SECOND, Duration::from_secs(30), Duration::from_secs(30));
    for (r, cached) in [(rule(q), true), (rule(q).lockout(lockout()), false)] {
        let g = global(&r).await;
        g.denies.put(&key, q, cost(2), &deny);
        match g.decide_now(&r, &no_locks(), &key, q, cost(2)) {
            Ok((d, Source::Global)) if cached => {
                assert!(!d.is_allowed());
                assert_eq!((d.limit(), d.window()), (10, SECOND));
                let wait = d.retry_after().unwrap();
                assert!(wait > Duration::from_secs(29) && wait <= Duration::from_secs(30));
            }
            Err(Asked::Exact(quotas)) if !cached => assert_eq!(quotas, Quotas::same(q)),
            _ => panic!("cached: {cached}"),
        }
        // A cheaper request may fit sooner: it asks Redis.
        let cheaper = g.decide_now(&r, &no_locks(), &key, q, cost(1));
        assert!(matches!(cheaper, Err(Asked::Exact(_))));
    }
}

#[tokio::test]
async fn an_open_breaker_decides_by_the_failure_mode_in_the_rules_quota() {
    let q = Quota::per_second(10).with_burst(15);
    let r = rule(q).on_redis_failure(FailureMode::FailOpen);
    let g = global(&r).await;
    for _ in 0..5 {
        g.guard.failed(&Cause::Timeout(r.failure.timeout));
    }
    let Ok((d, source)) = g.decide_now(&r, &no_locks(), &Key::from("k"), q, cost(1)) else {
        panic!("an open breaker skips Redis");
    };
    assert_eq!(d, Decision::allowed(10, SECOND, 15, Duration::ZERO));
    assert_eq!(source, Source::FailOpen);
}
