//! What a rule does with a request its key extractor finds no key for, and
//! the lookup that runs the extractor and its fallback.

use http::StatusCode;
use http::request::Parts;

use crate::Key;
use crate::error::BuildError;
use crate::key::{Extracted, KeyExtractor};
use crate::now_or_later::NowOrLater;

/// What a rule does with a request its key extractor found no key for.
///
/// ```
/// use http::StatusCode;
/// use keyed_rate_limit::{key::KeyExtractor, rule::OnMissingKey};
///
/// let skip = OnMissingKey::Skip;
/// let reject = OnMissingKey::Reject(StatusCode::UNAUTHORIZED);
/// let by_ip = OnMissingKey::Fallback(KeyExtractor::peer_ip());
/// # let _ = (skip, reject, by_ip);
/// ```
#[derive(Clone, Debug, Default)]
pub enum OnMissingKey {
    /// The rule does not apply to this request (the default).
    #[default]
    Skip,
    /// Answer with this status (e.g. 401) and don't call the service.
    Reject(StatusCode),
    /// Count the request against another key instead (e.g. the client IP).
    /// When that one is missing too, the rule is skipped.
    Fallback(KeyExtractor),
}

/// The key a request counts against, once the extractors have run.
pub(crate) enum Found {
    Key(Key),
    /// The primary extractor found nothing and there is no fallback.
    Missing,
    /// The fallback found nothing either: the limit does not apply.
    Skip,
}

pub(crate) type Lookup = NowOrLater<Found>;

impl OnMissingKey {
    /// The configuration errors `key`, and the fallback extractor, carry.
    pub(crate) fn check_keys(&self, key: &KeyExtractor, rule: &str) -> Result<(), BuildError> {
        key.check(rule)?;
        match self {
            Self::Fallback(k) => k.check(rule),
            _ => Ok(()),
        }
    }

    /// Runs `key`, then the fallback if it finds nothing; sync extractors
    /// answer at once.
    pub(crate) fn lookup(&self, key: &KeyExtractor, parts: &Parts) -> Lookup {
        let fallback = match self {
            Self::Fallback(k) => Some(k),
            _ => None,
        };
        let fell_back = |key: Option<Key>| key.map_or(Found::Skip, Found::Key);
        match key.extract(parts) {
            Extracted::Now(Some(k)) => Lookup::Now(Found::Key(k)),
            Extracted::Now(None) => match fallback.map(|f| f.extract(parts)) {
                None => Lookup::Now(Found::Missing),
                Some(Extracted::Now(k)) => Lookup::Now(fell_back(k)),
                Some(Extracted::Later(f)) => {
                    Lookup::Later(Box::pin(async move { fell_back(f.await) }))
                }
            },
            Extracted::Later(f) => {
                let fallback = fallback.map(|k| k.extract(parts));
                Lookup::Later(Box::pin(async move {
                    match (f.await, fallback) {
                        (Some(k), _) => Found::Key(k),
                        (None, Some(fb)) => fell_back(fb.resolve().await),
                        (None, None) => Found::Missing,
                    }
                }))
            }
        }
    }
}
