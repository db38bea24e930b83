//! What every service of one concurrency layer shares, and the step from a
//! request to a slot or a refusal.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::StatusCode;
use http::request::Parts;

use super::permit::{Acquire, Acquired, Permit};
use super::slot_store::SlotStore;
use crate::gate::Admission;
use crate::headers::{Rendered, StaticQuotaMember};
use crate::key::KeyExtractor;
use crate::key::Misconfig;
use crate::key::lookup::{Found, KeyWatch, Lookup, OnMissingKey, lookup};
use crate::observe;
use crate::response::{Denied, Refusals, challenge, refusal};
use crate::{
    decision::Decision, decision::RateLimitDecision, decision::RuleDecision, decision::Source,
    key::Key,
};

pub(crate) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) key: KeyExtractor,
    pub(super) limit: u32,
    pub(super) on_missing: Option<OnMissingKey>,
    pub(super) watch: Arc<KeyWatch>,
    pub(super) deny_log: observe::Sampled,
    /// Its admitted requests' counter, resolved at build.
    pub(super) counted: observe::Counted,
    pub(super) retry_after: Duration,
    pub(super) max_key_len: usize,
    pub(super) headers: crate::headers::Headers,
    pub(super) deny: Refusals,
    pub(super) slots: SlotStore,
    pub(super) quota_member: Option<StaticQuotaMember>,
}

/// A found key with its slot or refusal.
enum Ready {
    Key(Key, Acquired),
    Reject(StatusCode, Option<Misconfig>),
    Skip,
}

/// Where [`Shared::decide`] stopped to await.
pub(crate) enum Stopped {
    /// The key extractor is async.
    Finding(BoxFuture<'static, Found>),
    /// The backend is.
    Taking(Key, BoxFuture<'static, Acquired>),
}

enum Taken {
    Ready(Ready),
    /// Redis is deciding.
    Pending(Key, BoxFuture<'static, Acquired>),
}

impl Taken {
    async fn resolve(self) -> Ready {
        match self {
            Self::Ready(r) => r,
            Self::Pending(key, fut) => Ready::Key(key, fut.await),
        }
    }
}

impl Shared {
    /// Finds the key and takes a slot without awaiting when it can (a
    /// sync key extractor and the local backend), else returns where it
    /// stopped for [`suspend`](Self::suspend).
    pub(crate) fn decide(&self, parts: &mut Parts) -> Result<Admission<Option<Permit>>, Stopped> {
        let found = match lookup(self.on_missing.as_ref(), &self.key, parts, &self.watch) {
            Lookup::Now(found) => found,
            Lookup::Later(find) => return Err(Stopped::Finding(find)),
        };
        match self.take(found) {
            Taken::Ready(t) => Ok(self.admit(parts, t)),
            Taken::Pending(key, fut) => Err(Stopped::Taking(key, fut)),
        }
    }

    /// The rest of [`decide`](Self::decide), awaited.
    pub(crate) fn suspend(
        self: &Arc<Self>,
        mut parts: Parts,
        stopped: Stopped,
    ) -> crate::gate::Pending<Option<Permit>> {
        let this = self.clone();
        Box::pin(async move {
            let taken = match stopped {
                Stopped::Finding(find) => this.take(find.await).resolve().await,
                Stopped::Taking(key, fut) => Taken::Pending(key, fut).resolve().await,
            };
            let admission = this.admit(&mut parts, taken);
            (parts, admission)
        })
    }

    fn take(&self, found: Found) -> Taken {
        let key = match found {
            Found::Key(k) => k,
            Found::Skip => return Taken::Ready(Ready::Skip),
            Found::Reject(status, misconfig) => {
                return Taken::Ready(Ready::Reject(status, misconfig));
            }
        };
        let bounded = key.clone().bounded(self.max_key_len);
        match self
            .slots
            .acquire(&self.name, bounded, self.limit, self.retry_after)
        {
            Acquire::Now(outcome) => Taken::Ready(Ready::Key(key, outcome)),
            Acquire::Later(fut) => Taken::Pending(key, fut),
        }
    }

    /// Builds the admission from a slot or a refusal; an admitted request's
    /// decision joins the rate limiter's in the extensions when that layer
    /// put one there (its `decision_extension`, off by default).
    fn admit(&self, parts: &mut Parts, taken: Ready) -> Admission<Option<Permit>> {
        let (key, outcome) = match taken {
            Ready::Key(key, outcome) => (key, outcome),
            Ready::Skip => return Admission::Go(Rendered::new(), None),
            Ready::Reject(status, misconfig) => {
                let denied = Denied::rejected(self.name.clone(), status, misconfig);
                let mut res = refusal(&self.deny, &denied, &parts.headers, Rendered::new());
                challenge(&mut res, self.key.name());
                return Admission::Stop(res);
            }
        };
        let mut headers = Rendered::new();
        let source = outcome.source;
        match outcome.verdict {
            Ok((permit, held)) => {
                self.counted.allow();
                // When a slot frees is unknown: `t` is the hint a refusal gets.
                let decision = Decision::allowed(
                    self.limit,
                    self.retry_after,
                    self.limit.saturating_sub(held),
                    Duration::ZERO,
                )
                .with_next_unit(self.retry_after);
                let mut rule = self.rule_decision(decision, source);
                self.headers
                    .render(std::slice::from_mut(&mut rule), &mut headers);
                if let Some(d) = parts.extensions.get_mut::<RateLimitDecision>() {
                    d.rules.push(rule);
                }
                Admission::Go(headers, Some(permit))
            }
            Err(refused) => {
                let wait = refused.retry_after.max(Duration::from_millis(1));
                let decision = Decision::denied(self.limit, self.retry_after, wait, wait);
                observe::deny(
                    &self.counted,
                    &self.name,
                    || key.fingerprint(),
                    decision.retry_after(),
                    false,
                    &self.deny_log,
                );
                self.headers
                    .render(&mut [self.rule_decision(decision, source)], &mut headers);
                let denied = Denied::new(self.name.clone(), Some(wait));
                Admission::Stop(refusal(&self.deny, &denied, &parts.headers, headers))
            }
        }
    }

    fn rule_decision(&self, decision: Decision, source: Source) -> RuleDecision {
        RuleDecision {
            rule: self.name.clone(),
            quota_member: StaticQuotaMember::for_decision(&self.quota_member, &decision),
            decision,
            source,
            shadow: false,
            concurrency: true,
            hidden: false,
            partition: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::concurrency::ConcurrencyLimitLayer;
    use crate::error::BuildError;
    use bytes::Bytes;
    use http::Response;
    use http_body_util::Full;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn grpc_refusal_is_resource_exhausted_with_pushback() {
        let layer = ConcurrencyLimitLayer::builder("streams", KeyExtractor::everyone(), 1)
            .retry_after(Duration::from_millis(2500))
            .build()
            .unwrap();
        let mut svc = layer.layer(tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Full::<Bytes>::default()))
        }));
        let grpc = || {
            http::Request::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap()
        };
        // The first response's body is kept unread: it holds the slot.
        let held = svc.ready().await.unwrap().call(grpc()).await.unwrap();
        let res = svc.ready().await.unwrap().call(grpc()).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(res.headers()["grpc-retry-pushback-ms"], "2500");
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(
            res.headers()["grpc-message"],
            "rate limit \"streams\" exceeded; retry in 3 s"
        );
        drop(held);
        assert_eq!(layer.in_flight(&Key::from("*")), 0);
    }

    #[test]
    fn build_checks_settings() {
        let b = || ConcurrencyLimitLayer::builder("x", KeyExtractor::everyone(), 1);
        assert!(matches!(
            ConcurrencyLimitLayer::builder("", KeyExtractor::everyone(), 1).build(),
            Err(BuildError::InvalidRuleName(_))
        ));
        assert!(b().retry_after(Duration::ZERO).build().is_err());
        assert!(b().max_key_len(8).build().is_err());
        assert!(b().build().is_ok());
    }
}
