//! One rule spent by the byte, for the bandwidth layer: its key lookup
//! and its bucket, local or leased from Redis, with no request around it.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::chain::{Chain, ChainConfig};
use super::rule::CompiledRule;
use super::spend::Spend;
use crate::error::BuildError;
use crate::key::lookup::{Lookup, lookup};
use crate::rule::Rule;
use crate::util::now_or_later::NowOrLater;
use crate::{decision::Decision, decision::Source, key::Key, quota::Quota};

/// A compiled rule whose cost is given per call: a body's bytes.
pub(crate) struct Meter {
    chain: Arc<Chain>,
}

impl Meter {
    /// Checks and compiles `rule` as a layer's only rule would be.
    pub(crate) fn new(
        rule: Rule,
        instances: Option<u32>,
        max_key_len: usize,
    ) -> Result<Self, BuildError> {
        let cfg = ChainConfig {
            instances,
            max_key_len,
            cleanup_every: Duration::from_secs(60),
            refunds: false,
        };
        let chain = Chain::compile(vec![rule], cfg, false, None)?;
        Ok(Self {
            chain: Arc::new(chain),
        })
    }

    fn rule(&self) -> &Arc<CompiledRule> {
        &self.chain.rules[0]
    }

    /// The request's key, under the rule's missing-key policy.
    pub(crate) fn find(&self, parts: &Parts) -> Lookup {
        self.chain.start_sweeper();
        let r = self.rule();
        lookup(r.rule.on_missing.as_ref(), &r.rule.key, parts, &r.watch)
    }

    fn quota(&self) -> Quota {
        let r = self.rule();
        // The meter's rule has a static quota, checked at build.
        let q = r.rule.static_quota().unwrap_or(Quota::per_second(1));
        super::rule::share(&r.rule, q, r.instances)
    }

    /// Spends `units` of `key`'s bucket, or says how long until they fit;
    /// the source says where they were spent, for [`give_back`](Self::give_back).
    pub(crate) fn take(&self, key: &Key, units: NonZeroU32) -> NowOrLater<(Decision, Source)> {
        self.rule().check(key, self.quota(), units)
    }

    /// Gives back `units` that [`take`](Self::take) spent from `source` and
    /// were not used (a body ended with some left).
    pub(crate) fn give_back(&self, key: &Key, units: u32, source: Source) {
        let spend = Spend {
            rule: self.rule().clone(),
            key: key.clone(),
            quota: self.quota(),
            cost: units,
            source,
            // A bandwidth bucket has no windows.
            charged: None,
        };
        self.rule().adjust_spent(&spend, -i64::from(units));
    }

    /// The rule the budget is.
    pub(crate) fn as_rule(&self) -> &Rule {
        &self.rule().rule
    }

    /// Keys held in this process.
    pub(crate) fn local_keys(&self) -> usize {
        self.chain.local_keys()
    }
}
