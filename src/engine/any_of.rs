//! Any-of groups: members asked in order, the request charged to the first
//! that admits it, refused only when every member refuses.

use std::sync::Arc;

use http::request::Parts;

use super::decide::{Grouped, Outcome, Step};
use futures_util::future::BoxFuture;

use super::rule::{CompiledRule, Store, share};
use crate::rule::QuotaSource;
use crate::{decision::RuleDecision, decision::Source};

/// A group being decided: the members still to ask, and the refusals so
/// far. Moves into the suspended evaluation when a member must await.
pub(crate) struct AnyOf {
    /// The next member to ask, and one past the last.
    pub(super) next: usize,
    pub(super) end: usize,
    denied: Vec<RuleDecision>,
}

/// Where a group stopped: decided (or reading later global members for
/// the headers), or awaiting the member before `next`.
pub(super) enum Asked {
    Done(Step),
    Awaiting(Box<AnyOf>, BoxFuture<'static, Outcome>),
}

impl AnyOf {
    /// Asks the members of the group that starts at `at` while each answers
    /// at once.
    pub(super) fn start(rules: &[Arc<CompiledRule>], at: usize, parts: &Parts) -> Asked {
        let mut g = Self {
            next: at,
            end: at + rules[at].span,
            denied: Vec::new(),
        };
        while g.next < g.end {
            let member = &rules[g.next];
            g.next += 1;
            match member.step(parts) {
                Step::Now(o) => {
                    if let Some(done) = g.feed(o, rules, parts) {
                        return Asked::Done(done);
                    }
                }
                Step::Later(pending) => return Asked::Awaiting(Box::new(g), pending),
            }
        }
        Asked::Done(Step::Now(g.finish()))
    }

    /// Goes on after the member before `next` answered `outcome`.
    pub(super) async fn resume(
        mut self,
        outcome: Outcome,
        rules: &[Arc<CompiledRule>],
        parts: &Parts,
    ) -> Outcome {
        if let Some(done) = self.feed(outcome, rules, parts) {
            return done.resolve().await;
        }
        while self.next < self.end {
            let member = &rules[self.next];
            self.next += 1;
            let o = member.step(parts).resolve().await;
            if let Some(done) = self.feed(o, rules, parts) {
                return done.resolve().await;
            }
        }
        self.finish()
    }

    /// Takes one member's answer; the group's outcome once it is known
    /// (later, when a global member after the one that admitted is read).
    fn feed(&mut self, o: Outcome, rules: &[Arc<CompiledRule>], parts: &Parts) -> Option<Step> {
        match o {
            Outcome::Skip => None,
            Outcome::Decided(d, _) if !d.decision.is_allowed() => {
                self.denied.push(d);
                None
            }
            Outcome::Decided(d, spend) => {
                let mut decisions = std::mem::take(&mut self.denied);
                decisions.push(d);
                let later: Vec<Peek> = rules[self.next..self.end]
                    .iter()
                    .filter_map(|m| m.peek(parts))
                    .collect();
                let group = |decisions| {
                    Outcome::Group(Box::new(Grouped {
                        decisions,
                        spend,
                        allowed: true,
                    }))
                };
                if later.iter().all(|p| matches!(p, Peek::Now(_))) {
                    decisions.extend(later.into_iter().filter_map(Peek::now));
                    return Some(Step::Now(group(decisions)));
                }
                Some(Step::Later(Box::pin(async move {
                    for p in later {
                        let d = match p {
                            Peek::Now(d) => Some(d),
                            Peek::Read(read) => read.await,
                        };
                        decisions.extend(d);
                    }
                    group(decisions)
                })))
            }
            // A rejection, or a nested group (never built).
            other => Some(Step::Now(other)),
        }
    }

    /// Every member refused, or none applied. The members stay in the
    /// group's order, as on an allow; the refusal picks the one that answers.
    fn finish(self) -> Outcome {
        let decisions = self.denied;
        if decisions.is_empty() {
            return Outcome::Skip;
        }
        Outcome::Group(Box::new(Grouped {
            decisions,
            spend: None,
            allowed: false,
        }))
    }
}

/// A member after the one that admitted, as the headers show it: read
/// now, or read from Redis.
enum Peek {
    Now(RuleDecision),
    /// A global member's read (feature `redis`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Read(BoxFuture<'static, Option<RuleDecision>>),
}

impl Peek {
    fn now(self) -> Option<RuleDecision> {
        match self {
            Self::Now(d) => Some(d),
            Self::Read(_) => None,
        }
    }
}

impl CompiledRule {
    /// What a member after the one that admitted would tell a request of
    /// one unit now, without spending it: from the local store, or for a
    /// global member one read-only Redis call (under its timeout, skipped
    /// while its breaker is open). `None` for a `quota_fn` or async key, or
    /// a missing key.
    fn peek(self: &Arc<Self>, parts: &Parts) -> Option<Peek> {
        let QuotaSource::Static(q) = self.rule.quota else {
            return None;
        };
        let quota = share(&self.rule, q, self.instances);
        let key = self.rule.key.extract_now(parts)?;
        let key = self.bounded(&key).into_owned();
        if let Some(left) = self.locks.locked(&key) {
            let d = crate::decision::Decision::denied(quota.limit(), quota.window(), left, left);
            return Some(Peek::Now(self.rule_decision(&key, d, Source::Locked)));
        }
        match &self.store {
            Store::Local(store) => {
                let d = store.adjust(&key, quota, 0);
                Some(Peek::Now(self.rule_decision(&key, d, Source::Local)))
            }
            #[cfg(feature = "redis")]
            Store::Global(g) => {
                let (this, g) = (self.clone(), g.clone());
                Some(Peek::Read(Box::pin(async move {
                    let d = g.read(&this.rule, &key, quota).await?;
                    Some(this.rule_decision(&key, d, Source::Global))
                })))
            }
        }
    }
}

/// Checks that each group's members stand together and can be members;
/// returns each rule's span: a group's size at its first member, 0 at the
/// others, 1 for a rule on its own.
pub(super) fn spans(rules: &[crate::rule::Rule]) -> Result<Vec<usize>, crate::error::BuildError> {
    use crate::error::BuildError;
    use crate::policy::OnDeny;
    let mut spans = vec![1; rules.len()];
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < rules.len() {
        let Some(group) = rules[i].group.as_deref() else {
            i += 1;
            continue;
        };
        let err = |error| BuildError::InvalidGroup {
            group: group.to_owned(),
            error,
        };
        if seen.contains(&group) {
            return Err(err("its members must stand together in the chain"));
        }
        if rules.iter().any(|r| &*r.name == group) {
            return Err(err("a rule has the group's name"));
        }
        seen.push(group);
        let len = rules[i..]
            .iter()
            .take_while(|r| r.group.as_deref() == Some(group))
            .count();
        for r in &rules[i..i + len] {
            if r.shadow {
                return Err(err(
                    "a shadow rule never refuses, so the members after it would never be asked",
                ));
            }
            if matches!(r.on_deny, OnDeny::Wait { .. }) {
                return Err(err(
                    "a member can't wait (OnDeny::Wait): the next member is asked instead",
                ));
            }
        }
        spans[i] = len;
        spans[i + 1..i + len].fill(0);
        i += len;
    }
    Ok(spans)
}
