//! What every service of one layer shares: the current chain, the header
//! style, the refusal, and the step from a verdict to an admission.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use http::StatusCode;
use http::request::Parts;

use crate::decision::{Decisions, RateLimitDecision, RuleDecision};
use crate::engine::{Chain, ChainConfig, Settlement, Suspended, Verdict};
use crate::gate::{Admission, Pending};
use crate::headers::Headers;
use crate::response::{Denied, Refusals, challenge, refusal};

pub(crate) struct Shared {
    /// Swapped whole by [`RateLimitLayer::reload`].
    pub(crate) chain: Current,
    pub(super) config: ChainConfig,
    /// One reload at a time: each carries state over from the chain it replaces.
    pub(super) reloading: Mutex<()>,
    pub(super) headers: Headers,
    pub(super) deny: Refusals,
    pub(super) extension: bool,
    /// `RateLimitBuilder::exempt`.
    pub(super) exempt: Option<Arc<crate::settings::ExemptFn>>,
}

/// The chain requests are decided by. A read lock, not a lock-free swap
/// (`arc-swap`): it is held only while a request is decided without
/// awaiting (an evaluation that awaits takes its own `Arc`), costs two
/// atomic operations, and keeps the dependency tree as small as
/// tower_governor's.
pub(crate) struct Current(pub(super) RwLock<Arc<Chain>>);

impl Current {
    /// Runs `f` on the current chain.
    pub(super) fn with<T>(&self, f: impl FnOnce(&Arc<Chain>) -> T) -> T {
        f(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn load(&self) -> Arc<Chain> {
        self.with(Arc::clone)
    }

    /// Runs `at_swap`, then swaps in `new`, both under the write lock (the old chain is dropped outside
    /// it): no
    /// request is being decided on the old chain meanwhile, so none sees
    /// part of what `at_swap` changes (a reload's forwarding of the old
    /// stores) and part not.
    pub(super) fn store_with(&self, new: Arc<Chain>, at_swap: impl FnOnce()) {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        at_swap();
        let old = std::mem::replace(&mut *current, new);
        drop(current);
        drop(old);
    }
}

impl Shared {
    /// Decides on `parts` with the current chain, unless a step has to
    /// await. Not generic over the service, so it is compiled once and
    /// keeps the services' `call` small.
    pub(crate) fn decide(
        &self,
        parts: &mut Parts,
    ) -> Result<Admission<Option<Box<Settlement>>>, Box<Suspended>> {
        if let Some(exempt) = &self.exempt
            && exempt(parts)
        {
            crate::observe::layer_exempt();
            return Ok(self.conclude(Verdict::Allow(None), &mut Decisions::new(), parts));
        }
        // One chain for the whole request, even if a reload lands meanwhile.
        let mut decisions = Decisions::new();
        let verdict = self
            .chain
            .with(|chain| chain.evaluate(parts, &mut decisions))?;
        Ok(self.conclude(verdict, &mut decisions, parts))
    }

    /// The rest of a decision that had to await, on the chain it began on.
    pub(crate) fn finish(
        self: Arc<Self>,
        mut parts: Parts,
        suspended: Box<Suspended>,
    ) -> Pending<Option<Box<Settlement>>> {
        Box::pin(async move {
            let (mut decisions, verdict);
            (parts, decisions, verdict) = suspended.resume(parts).await;
            let admission = self.conclude(verdict, &mut decisions, &mut parts);
            (parts, admission)
        })
    }

    /// Turns the chain's verdict into headers and, when allowed, puts the
    /// decision in the extensions for the handler. `rules` by reference:
    /// moving them costs more than the headers' use of them. Inlined, so
    /// the admission is built where the caller returns it.
    #[inline(always)]
    pub(crate) fn conclude(
        &self,
        verdict: Verdict,
        rules: &mut Decisions,
        parts: &mut Parts,
    ) -> Admission<Option<Box<Settlement>>> {
        let mut headers = crate::headers::Rendered::new();
        match verdict {
            Verdict::Allow(settle) => {
                self.headers.render(rules, &mut headers);
                if self.extension {
                    let rules = std::mem::take(rules);
                    // Under an outer rate limiter, its decisions come first.
                    if let Some(outer) = parts.extensions.insert(RateLimitDecision { rules })
                        && let Some(d) = parts.extensions.get_mut::<RateLimitDecision>()
                    {
                        d.rules.insert_many(0, outer.rules);
                    }
                }
                Admission::Go(headers, settle)
            }
            Verdict::Deny(n) => {
                // Only the refusing rule (or group): the rules before it had
                // their units given back, so their numbers are stale.
                let at = rules.len().saturating_sub(n);
                self.headers.render(&mut rules[at..], &mut headers);
                let denied = denial(&rules[at..]);
                Admission::Stop(refusal(&self.deny, &denied, &parts.headers, headers))
            }
            Verdict::Reject {
                rule,
                status,
                misconfig,
            } => Admission::Stop(self.reject(rule, status, misconfig, rules, parts)),
        }
    }

    /// A request `rule` rejects for its key: off the allowed request's
    /// path, so not inlined into [`conclude`](Self::conclude).
    #[inline(never)]
    fn reject(
        &self,
        rule: Arc<str>,
        status: StatusCode,
        misconfig: Option<crate::key::Misconfig>,
        rules: &mut Decisions,
        parts: &Parts,
    ) -> http::Response<bytes::Bytes> {
        let mut headers = crate::headers::Rendered::new();
        self.headers.render(rules, &mut headers);
        let denied = Denied::rejected(rule, status, misconfig);
        let mut res = refusal(&self.deny, &denied, &parts.headers, headers);
        if res.status() == StatusCode::UNAUTHORIZED {
            // The chain the request was decided on may have been reloaded
            // since; a rule gone meanwhile gets the default challenge.
            let key = self.chain.with(|c| {
                c.rules()
                    .find(|r| *r.name == *denied.rule)
                    .map(|r| r.key.name().to_owned())
            });
            challenge(&mut res, key.as_deref().unwrap_or(""));
        }
        res
    }
}

/// The refusal of a rule, or of an any-of group's members (in the group's
/// order): the member whose units come back soonest answers, and gives the
/// `Retry-After` (a cost that never fits, none, last of all).
#[inline(never)]
fn denial(refused: &[RuleDecision]) -> Denied {
    let (answer, violated) = match refused {
        [one] => (one, Vec::new()),
        group => {
            let wait = |d: &&RuleDecision| d.decision.retry_after().unwrap_or(Duration::MAX);
            let answer = group
                .iter()
                .min_by_key(wait)
                .expect("a deny carries its decision");
            let visible = group.iter().filter(|d| !d.hidden);
            (answer, visible.map(|d| d.rule.clone()).collect())
        }
    };
    Denied {
        hidden: answer.hidden,
        violated,
        ..Denied::new(answer.rule.clone(), answer.decision.retry_after())
    }
}
