//! The operator's handle on a layer's counters: read, reset, charge,
//! give back, block.

use std::sync::Arc;
use std::time::Duration;

use super::shared::Shared;
use crate::engine::ControlError;
use crate::policy::ControlOp;
use crate::{decision::Decision, key::Key};

/// Reads and moves one key's counters of one rule, outside any request:
/// after a captcha or a password reset, to punish or forgive a client, or
/// to block one for a while. Made by [`RateLimitLayer::control`](crate::RateLimitLayer::control);
/// cheap to clone, and it follows [`reload`](crate::RateLimitLayer::reload)s.
///
/// `key` is the key as the rule's extractor produces it (a header's bytes,
/// an IP's text, a user id), before any bound: an overlong key is hashed as
/// the layer hashes it. Anything [`Key`] converts from will do: a `String`,
/// a `&'static str`, bytes; a borrowed `&str` goes as `s.to_owned()` or
/// [`Key::copy_from_slice`]. Each operation works on local and global rules
/// alike; on a global rule it is one Redis call under the rule's
/// `redis_timeout` patience, and its failure is a [`ControlError`], with
/// no failure mode. Another gateway sees the change at its next Redis
/// call: within a second for a lock it holds a copy of, and once the
/// `Retry-After` it gave has passed for a deny in its deny cache.
///
/// `peek`, `reset`, `penalize` and `reward` need a rule with a static
/// quota ([`ControlError::DynamicQuota`] otherwise); `block` needs a
/// [blockable](crate::rule::Rule::blockable) rule or one with a lockout
/// ([`ControlError::NotBlockable`] otherwise: a rule that cannot be locked
/// never looks for a lock, so a global one reads no lock key in Redis), and
/// `unblock` works on any rule. A local rule whose key space is full drops a charge
/// for a key it holds no place for (`penalize` then reads a whole bucket),
/// and refuses a `block` ([`ControlError::KeySpaceFull`]).
///
/// On a global rule whose quota changed, each operation converts and
/// follows the key as a decision does: a key this gateway has not decided
/// since its reload is converted first, and a key another gateway already
/// moved (ADR 25) is read and changed where it went, in that quota, its
/// units converted as a request's cost is; the moved key keeps pointing
/// there, so this gateway's requests follow too. A
/// calendar count made under another limit is read as the next decision
/// reads it (converted proportionally).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
/// let layer = RateLimitLayer::builder()
///     .rule(Rule::new("login", KeyExtractor::header("x-user"), Quota::per_minute(5)).blockable(true))
///     .build().unwrap();
/// let control = layer.control();
/// assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 5);
/// assert_eq!(control.penalize("login", "alice", 3).await.unwrap().remaining(), 2);
/// assert_eq!(control.reward("login", "alice", 1).await.unwrap().remaining(), 3);
/// control.reset("login", "alice").await.unwrap();
/// assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 5);
/// control.block("login", "alice", Duration::from_secs(60)).await.unwrap();
/// assert!(!control.peek("login", "alice").await.unwrap().is_allowed());
/// control.unblock("login", "alice").await.unwrap();
/// assert!(control.peek("login", "alice").await.unwrap().is_allowed());
/// # }
/// ```
#[derive(Clone)]
pub struct Control {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

impl Control {
    async fn run(
        &self,
        rule: &str,
        key: Key,
        op: ControlOp,
    ) -> Result<Option<Decision>, ControlError> {
        let chain = self.shared.chain.load();
        let Some(compiled) = chain.find(rule) else {
            return Err(ControlError::UnknownRule(rule.to_owned()));
        };
        compiled.control(&key, op).await
    }

    async fn state(&self, rule: &str, key: Key, op: ControlOp) -> Result<Decision, ControlError> {
        let d = self.run(rule, key, op).await?;
        Ok(d.expect("a read or an adjustment returns the key's state"))
    }

    /// What a request of one unit would be told now, without spending
    /// anything: allowed with the units left, or denied with the wait
    /// (for a blocked key, the block's time left).
    pub async fn peek(&self, rule: &str, key: impl Into<Key>) -> Result<Decision, ControlError> {
        self.state(rule, key.into(), ControlOp::Adjust(0)).await
    }

    /// Forgets the key's count and lifts its lock (and the denies counted
    /// toward one): the key starts afresh.
    pub async fn reset(&self, rule: &str, key: impl Into<Key>) -> Result<(), ControlError> {
        self.run(rule, key.into(), ControlOp::Reset).await.map(drop)
    }

    /// Spends `units` now, with no decision: at most down to an empty
    /// bucket (the next unit waits as after a full burst), never into debt.
    /// Returns the key's state after it.
    pub async fn penalize(
        &self,
        rule: &str,
        key: impl Into<Key>,
        units: u32,
    ) -> Result<Decision, ControlError> {
        let op = ControlOp::Adjust(i64::from(units));
        self.state(rule, key.into(), op).await
    }

    /// Gives `units` back, at most up to a whole bucket. Returns the key's
    /// state after it. (A window algorithm gives them back to the current
    /// window.)
    pub async fn reward(
        &self,
        rule: &str,
        key: impl Into<Key>,
        units: u32,
    ) -> Result<Decision, ControlError> {
        let op = ControlOp::Adjust(-i64::from(units));
        self.state(rule, key.into(), op).await
    }

    /// Denies the key for `period`, as a [lockout](crate::policy::Lockout)
    /// does: `Retry-After` the time left, `outcome="locked"`. Replaces a
    /// lock the key has. On a local rule the blocked key costs no backend
    /// call while it lasts; on a global rule the block is kept in Redis for
    /// every gateway, and a gateway answers from what it learned for a
    /// second, then asks Redis again (one call a second per blocked key,
    /// so an `unblock` elsewhere reaches it within a second).
    pub async fn block(
        &self,
        rule: &str,
        key: impl Into<Key>,
        period: Duration,
    ) -> Result<(), ControlError> {
        self.run(rule, key.into(), ControlOp::Block(period))
            .await
            .map(drop)
    }

    /// Lifts the key's lock (a block or a lockout) and forgets the denies
    /// counted toward one; its count stays.
    pub async fn unblock(&self, rule: &str, key: impl Into<Key>) -> Result<(), ControlError> {
        self.run(rule, key.into(), ControlOp::Unblock)
            .await
            .map(drop)
    }
}
