//! What a rule does with a request its key extractor finds no key for, the
//! lookup that runs the extractor and its fallback, and the watch that
//! keeps a limit that applies to nothing from going unnoticed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;

use crate::error::BuildError;
use crate::key::Key;
use crate::key::{Extracted, KeyExtractor, Misconfig};
use crate::observe;
use crate::util::now_or_later::NowOrLater;
use crate::util::throttle::Throttle;

/// What a rule does with a request its key extractor found no key for.
///
/// A rule given none of these skips a request without a key, but refuses
/// with 500 (and logs an error at most once a minute) a request whose key
/// *source* is missing: the setup is wrong, so the limit would never
/// apply. That is `peer_ip()`/`client_ip()` without `ConnectInfo`,
/// `matched_route()` outside the router, and `extension::<T>()` without a
/// `T`. Setting a policy says requests without the key are expected:
///
/// ```
/// use axum::http::StatusCode;
/// use keyed_rate_limit::{KeyExtractor, OnMissingKey};
///
/// // Anonymous requests (no `User` extension) are not limited by this rule.
/// let skip = OnMissingKey::Skip;
/// // They are refused instead.
/// let reject = OnMissingKey::Reject(StatusCode::UNAUTHORIZED);
/// // They are counted by IP.
/// let by_ip = OnMissingKey::Fallback(KeyExtractor::peer_ip());
/// # let _ = (skip, reject, by_ip);
/// ```
///
/// An extractor that can never work in a correct setup (`peer_ip()`
/// without `ConnectInfo`, `matched_route()` outside the router) is logged
/// whatever the policy.
#[derive(Clone, Debug)]
pub enum OnMissingKey {
    /// The rule does not apply to this request.
    Skip,
    /// Answer with this status (e.g. 401) and don't call the service. A 401
    /// carries the `WWW-Authenticate` challenge RFC 9110 requires:
    /// `ApiKey header="<name>"` for a key read from a header other than
    /// `Authorization`, `Bearer` otherwise, or the one a
    /// [`deny_response`](crate::rate_limit::RateLimitBuilder::deny_response)
    /// sets ([`headers`](crate::headers) shows the answer).
    Reject(StatusCode),
    /// Count the request against another key instead (e.g. the client IP).
    /// When that one is missing too, the rule is skipped.
    Fallback(KeyExtractor),
}

/// The key a request counts against, once the extractors have run.
pub(crate) enum Found {
    Key(Key),
    /// Refused with this status: the rule rejects requests without a key,
    /// or (a 500, with what is missing) no request can have the key in
    /// this setup and no policy was chosen.
    Reject(StatusCode, Option<Misconfig>),
    /// The limit does not apply.
    Skip,
}

pub(crate) type Lookup = NowOrLater<Found>;

impl OnMissingKey {
    /// The configuration errors `key`, and the fallback extractor, carry.
    pub(crate) fn validate_keys(
        policy: Option<&Self>,
        key: &KeyExtractor,
        rule: &str,
    ) -> Result<(), BuildError> {
        key.validate(rule)?;
        match policy {
            Some(Self::Fallback(k)) => k.validate(rule),
            _ => Ok(()),
        }
    }
}

/// Runs `key`, then the policy when it finds nothing; sync extractors
/// answer at once. The found-key path costs one relaxed load.
pub(crate) fn lookup(
    policy: Option<&OnMissingKey>,
    key: &KeyExtractor,
    parts: &Parts,
    watch: &Arc<KeyWatch>,
) -> Lookup {
    match key.extract(parts) {
        Extracted::Now(Some(k)) => {
            watch.found();
            Lookup::Now(Found::Key(k))
        }
        Extracted::Now(None) => without_key(policy, key.absent(parts), parts, watch),
        Extracted::Later(f) => {
            // The request head is gone once the future runs.
            let absent = key.absent(parts);
            let fallback = match policy {
                Some(OnMissingKey::Fallback(fb)) => Some(fallback(fb, parts)),
                _ => None,
            };
            let (without, watch) = (Without::of(policy), watch.clone());
            Lookup::Later(Box::pin(async move {
                if let Some(k) = f.await {
                    watch.found();
                    return Found::Key(k);
                }
                if let Some(found) = keyless(without, absent, &watch) {
                    return found;
                }
                match fallback {
                    Some((found, absent)) => watch.fell_back(found.resolve().await, absent),
                    None => Found::Skip,
                }
            }))
        }
    }
}

/// The primary extractor found nothing.
fn without_key(
    policy: Option<&OnMissingKey>,
    absent: Option<Misconfig>,
    parts: &Parts,
    watch: &Arc<KeyWatch>,
) -> Lookup {
    if let Some(found) = keyless(Without::of(policy), absent, watch) {
        return Lookup::Now(found);
    }
    // Only a fallback leaves the decision to another extractor.
    let Some(OnMissingKey::Fallback(fb)) = policy else {
        return Lookup::Now(Found::Skip);
    };
    match fallback(fb, parts) {
        (NowOrLater::Now(k), absent) => Lookup::Now(watch.fell_back(k, absent)),
        (NowOrLater::Later(f), absent) => {
            let watch = watch.clone();
            Lookup::Later(Box::pin(async move { watch.fell_back(f.await, absent) }))
        }
    }
}

/// The fallback's key, and its missing source should it find none.
fn fallback(fb: &KeyExtractor, parts: &Parts) -> (Extracted, Option<Misconfig>) {
    (fb.extract(parts), fb.absent(parts))
}

/// What a rule does without a key, without the fallback extractor itself:
/// what the async path keeps, instead of a clone of the policy.
#[derive(Clone, Copy)]
enum Without {
    /// No policy: skip, or refuse a missing source.
    Checked,
    Skip,
    Reject(StatusCode),
    Fallback,
}

impl Without {
    fn of(policy: Option<&OnMissingKey>) -> Self {
        match policy {
            None => Self::Checked,
            Some(OnMissingKey::Skip) => Self::Skip,
            Some(OnMissingKey::Reject(status)) => Self::Reject(*status),
            Some(OnMissingKey::Fallback(_)) => Self::Fallback,
        }
    }
}

/// What a request without a key gets; `None` when the fallback decides.
fn keyless(without: Without, absent: Option<Misconfig>, watch: &KeyWatch) -> Option<Found> {
    let checked = matches!(without, Without::Checked);
    if let Some(m) = absent {
        if checked || m.always_wrong() {
            watch.misconfigured(m);
        }
        if checked {
            return Some(Found::Reject(StatusCode::INTERNAL_SERVER_ERROR, Some(m)));
        }
    }
    match without {
        Without::Reject(status) => Some(Found::Reject(status, None)),
        Without::Fallback => None,
        Without::Skip | Without::Checked => {
            watch.skipped();
            Some(Found::Skip)
        }
    }
}

/// How often the watch speaks, at most.
const EVERY: Duration = Duration::from_secs(60);

/// Keeps a rule's missing keys in view: a key source missing by setup is
/// an ERROR at most once a minute (and counted every time), and a rule
/// that found no key in any request for a minute is a warning. Every
/// request let through without a key (`outcome="unkeyed"`) or counted on
/// the fallback's key (`outcome="fallback_key"`) is counted, and, for a
/// key another layer sets (an extension), while the rule has never found
/// it each is a warning at once (at most one a minute): a layer placed
/// before the one that sets its key (auth) looks exactly like that. A
/// missing header is the client's choice, not a misplaced layer: counted,
/// not warned about.
#[derive(Debug)]
pub(crate) struct KeyWatch {
    rule: Arc<str>,
    extractor: Arc<str>,
    /// A key was found since the period began.
    found: AtomicBool,
    /// A key was ever found by the rule's own extractor.
    ever: AtomicBool,
    /// Its key is set by another layer (an extension).
    layered: bool,
    misplaced_log: Throttle,
    /// Requests skipped since the period began.
    skipped: AtomicU64,
    /// The first skip starts the first period.
    armed: AtomicBool,
    period: Throttle,
    every: Duration,
    misconfig_log: Throttle,
}

impl KeyWatch {
    pub(crate) fn new(rule: Arc<str>, extractor: &KeyExtractor) -> Arc<Self> {
        Arc::new(Self {
            rule,
            extractor: extractor.name().into(),
            found: AtomicBool::new(false),
            ever: AtomicBool::new(false),
            layered: extractor.set_by_a_layer(),
            misplaced_log: Throttle::default(),
            skipped: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            period: Throttle::default(),
            every: EVERY,
            misconfig_log: Throttle::default(),
        })
    }

    #[inline]
    fn found(&self) {
        // A store only when it changes: the line stays shared between cores.
        if !self.found.load(Ordering::Relaxed) {
            self.found.store(true, Ordering::Relaxed);
            self.ever.store(true, Ordering::Relaxed);
        }
    }

    fn fell_back(&self, key: Option<Key>, absent: Option<Misconfig>) -> Found {
        match key {
            Some(k) => {
                self.unkeyed("fallback_key");
                Found::Key(k)
            }
            None => {
                if let Some(m) = absent.filter(|m| m.always_wrong()) {
                    self.misconfigured(m);
                }
                self.skipped();
                Found::Skip
            }
        }
    }

    fn misconfigured(&self, m: Misconfig) {
        observe::key_misconfig(
            &self.rule,
            &self.extractor,
            m.kind(),
            &m,
            m.fix(),
            self.misconfig_log.ready(EVERY),
        );
    }

    /// A request not counted on the rule's own key: counted as `outcome`,
    /// and a warning while the rule has never found its own.
    fn unkeyed(&self, outcome: &'static str) {
        let never = self.layered && !self.ever.load(Ordering::Relaxed);
        let log = never && self.misplaced_log.ready(EVERY);
        observe::unkeyed(&self.rule, &self.extractor, outcome, log);
    }

    fn skipped(&self) {
        self.unkeyed("unkeyed");
        let skipped = self.skipped.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.period.ready(self.every) {
            return;
        }
        // A period ends: a warning if no request in it had a key.
        let found = self.found.swap(false, Ordering::Relaxed);
        self.skipped.store(0, Ordering::Relaxed);
        if self.armed.swap(true, Ordering::Relaxed) && !found {
            observe::no_key_found(&self.rule, &self.extractor, skipped, self.every);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_in_which_no_request_had_a_key_is_a_warning() {
        let (warns, _guard) = crate::util::warns::counted();
        let key = KeyExtractor::header("x-api-key");
        let watch = Arc::new(KeyWatch {
            every: Duration::ZERO,
            ..Arc::into_inner(KeyWatch::new("r".into(), &key)).unwrap()
        });
        let (parts, _) = http::Request::new(()).into_parts();
        let skip = Some(&OnMissingKey::Skip);
        let run = |parts: &Parts| match lookup(skip, &key, parts, &watch) {
            NowOrLater::Now(Found::Skip) => "skip",
            NowOrLater::Now(Found::Key(_)) => "key",
            _ => "other",
        };
        assert_eq!(
            run(&parts),
            "skip",
            "the first skip starts the first period"
        );
        // A missing header is the client's choice: no warning at once.
        assert_eq!(*warns.lock().unwrap(), 0);
        assert_eq!(run(&parts), "skip");
        assert_eq!(*warns.lock().unwrap(), 1, "a period without a key");
        let (with_key, _) = http::Request::builder()
            .header("x-api-key", "k")
            .body(())
            .unwrap()
            .into_parts();
        assert_eq!(run(&with_key), "key");
        assert_eq!(run(&parts), "skip");
        assert_eq!(*warns.lock().unwrap(), 1, "that period had a key");
    }

    /// An optional extension that never arrives (the limit before auth)
    /// skips every request, no 500, and the watch says it limits nothing.
    #[test]
    fn an_optional_extension_that_never_arrives_is_a_warning() {
        let (warns, _guard) = crate::util::warns::counted();
        let key = KeyExtractor::optional_extension::<u64>(|id| Key::from(*id));
        let watch = Arc::new(KeyWatch {
            every: Duration::ZERO,
            ..Arc::into_inner(KeyWatch::new("r".into(), &key)).unwrap()
        });
        let (parts, _) = http::Request::new(()).into_parts();
        for _ in 0..2 {
            assert!(matches!(
                lookup(None, &key, &parts, &watch),
                NowOrLater::Now(Found::Skip)
            ));
        }
        // At once (never its own key), then the period's.
        assert_eq!(*warns.lock().unwrap(), 2);
    }
}
