//! The backend: one connection (or pool, or cluster), the decisions and
//! control operations its scripts run, and this gateway's membership in
//! the live instance count.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::conn::{Call, Conn};
use super::error::RedisBackendError;
use super::keys;
use super::membership::Membership;
use super::script::{self, Decided, Grant, LeaseAsk, SlotOp, SlotReply, Target};
use crate::failure::{LiveCount, Reachability};
use crate::key::DEFAULT_MAX_KEY_LEN;
use crate::policy::ControlOp;
use crate::{algorithm::Algorithm, decision::Decision, key::Key, quota::Quota};

/// The longest a call outside a rule's guard waits for its reply.
pub(super) const UNGUARDED_TIMEOUT: Duration = Duration::from_secs(10);

/// The requests one script call may decide together: on a cluster, those
/// whose keys share a slot; elsewhere, all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Shard {
    #[cfg(feature = "redis-cluster")]
    slot: Option<redis::cluster_routing::Slot>,
}

/// A global rate-limit backend on a shared Redis. Cloning is cheap and clones
/// share the connection.
#[derive(Clone)]
pub struct RedisBackend {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) prefix: String,
    pub(super) conn: Conn,
    pub(super) reachability: Reachability,
    pub(super) eviction_policy: std::sync::OnceLock<String>,
    /// This gateway in the live instance count, when it is kept.
    pub(super) membership: Option<Membership>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.reachability.stop();
        // Leave the live count now rather than when the TTL runs out.
        if let Some(m) = self.membership.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let conn = self.conn.clone();
            let leave = m.leave(&self.prefix);
            rt.spawn(async move {
                let _ =
                    tokio::time::timeout(m.ttl, conn.invoke::<i64>(None, Call::Invocation(&leave)))
                        .await;
            });
        }
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match &self.inner.conn {
            Conn::Multiplexed(_) => "multiplexed",
            Conn::Pool(_) => "pool",
            #[cfg(feature = "redis-cluster")]
            Conn::Cluster(_) => "cluster",
            #[cfg(feature = "redis-sentinel")]
            Conn::Sentinel(_) => "sentinel",
        };
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("connection", &mode)
            .finish()
    }
}

impl RedisBackend {
    /// Whether this backend keeps the live instance count (`live_instances`).
    pub(crate) fn counts_live_instances(&self) -> bool {
        self.inner.membership.is_some()
    }

    /// Whether a rule name can be used with this backend: it must not contain
    /// braces, which would break the key's hash tag. Check it when rules are built.
    pub(crate) fn validate_rule_name(rule: &str) -> Result<(), RedisBackendError> {
        keys::validate_name("rule", rule)
    }

    /// Counts `cost` units of `key` under `rule` and decides, atomically in Redis.
    ///
    /// A cost that can never pass (above the burst for GCRA and token bucket,
    /// above the limit for the window algorithms) is refused without
    /// `Retry-After` and without calling Redis. A deny does not consume anything. Keys longer
    /// than [`DEFAULT_MAX_KEY_LEN`] count
    /// as their SHA-256, as in the layer with its default bound.
    pub async fn check(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        cost: u32,
    ) -> Result<Decision, RedisBackendError> {
        keys::validate_name("rule", rule)?;
        quota.validate().map_err(RedisBackendError::InvalidQuota)?;
        let key = key.clone().bounded(DEFAULT_MAX_KEY_LEN);
        let target = Target::unlocked(rule, algorithm, quota);
        let decided = self.check_next(target, &key, cost, None).await?;
        Ok(decided.decision)
    }

    /// [`check`](Self::check) for a key the layer already bounded, with
    /// the rule's locks; for an allow that left nothing, also the wait
    /// until one more unit fits: the deny cache can then answer the next
    /// requests without asking Redis for the deny first.
    pub(crate) async fn check_next(
        &self,
        target: Target<'_>,
        key: &Key,
        cost: u32,
        previous: Option<script::Previous>,
    ) -> Result<Decided, RedisBackendError> {
        let (algorithm, quota) = (target.algorithm, target.quota);
        // The rule chain checked the name and quota when it was built (and
        // request-time quotas before calling): no per-request re-check.
        if cost > algorithm.capacity(quota) {
            return Ok(Decided {
                decision: Decision::never(quota.limit(), quota.window()),
                next: None,
                locked: false,
                lock_started: false,
            });
        }
        let (flat, width) = self.rate_call(target, &[(key, cost)], previous).await?;
        Ok(script::batch_decisions(target.quota, &flat, width)
            .next()
            .expect("one reply, checked"))
    }

    /// [`check_next`](Self::check_next) for a batch of requests in one
    /// script call: each (key, cost) decided in turn, in order, as if each
    /// were its own call. Every cost must fit the quota's capacity (the
    /// chain checks before asking), and on a cluster every key must be of
    /// one [`Shard`].
    pub(crate) async fn check_batch(
        &self,
        target: Target<'_>,
        requests: &[(&Key, u32)],
        previous: Option<script::Previous>,
    ) -> Result<Vec<Decided>, RedisBackendError> {
        let (flat, width) = self.rate_call(target, requests, previous).await?;
        Ok(script::batch_decisions(target.quota, &flat, width).collect())
    }

    /// One request of each target, the way [`check_next`](Self::check_next)
    /// decides it, in one script call (`multi.lua`): several rules'
    /// decisions in one round trip. Not on a cluster, whose keys hash to
    /// slots of their own ([`shares_calls`](Self::shares_calls)); every cost
    /// must fit its quota's capacity (the chain checks before asking).
    pub(crate) async fn check_together(
        &self,
        requests: &[(Target<'_>, &Key, u32, Option<script::Previous>)],
    ) -> Result<Vec<Decided>, RedisBackendError> {
        let parts: Vec<script::Part<'_>> = requests
            .iter()
            .map(|&(target, key, cost, previous)| script::Part {
                target,
                keys: self.batch_keys(target, key, previous.as_ref()),
                cost,
                previous,
            })
            .collect();
        let (eval, widths) = script::multi(&parts);
        let reply: redis::Value = self.eval(&eval).await?;
        script::replies(&reply, &parts, &widths).ok_or_else(|| {
            let short = (redis::ErrorKind::UnexpectedReturnType, "a reply per call");
            RedisBackendError::Redis(short.into())
        })
    }

    /// Whether several rules' calls can go as one
    /// ([`check_together`](Self::check_together)): not on a cluster.
    pub(crate) fn shares_calls(&self) -> bool {
        !self.inner.conn.is_cluster()
    }

    /// The rate script's call for `requests`: its flat reply, checked to
    /// hold a reply of the returned width per request.
    async fn rate_call(
        &self,
        target: Target<'_>,
        requests: &[(&Key, u32)],
        previous: Option<script::Previous>,
    ) -> Result<(Vec<redis::Value>, usize), RedisBackendError> {
        let Target {
            algorithm,
            quota,
            locks,
            ..
        } = target;
        let (eval, width) = if let [(key, cost)] = requests {
            // A lone request (most calls at low concurrency): no index, and
            // nothing collected.
            let keys = vec![self.batch_keys(target, key, previous.as_ref())];
            script::rate(algorithm, keys, quota, &[(0, *cost)], locks, previous)
        } else {
            let mut index: HashMap<&Key, usize> = HashMap::new();
            let mut keys = Vec::with_capacity(requests.len());
            let items: Vec<script::Item> = requests
                .iter()
                .map(|&(key, cost)| {
                    let i = *index.entry(key).or_insert_with(|| {
                        keys.push(self.batch_keys(target, key, previous.as_ref()));
                        keys.len() - 1
                    });
                    (i, cost)
                })
                .collect();
            script::rate(algorithm, keys, quota, &items, locks, previous)
        };
        // The integers are read where they are: redis-rs's conversion to a
        // `Vec<i64>` would allocate and copy them.
        let flat = match self.eval(&eval).await? {
            redis::Value::Array(values) => values,
            _ => Vec::new(),
        };
        // One reply per request, whole: anything else is not our script's.
        let ints = || flat.iter().all(|v| matches!(v, redis::Value::Int(_)));
        if flat.len() != width * requests.len() || !ints() {
            let short = (
                redis::ErrorKind::UnexpectedReturnType,
                "a reply per request",
            );
            return Err(RedisBackendError::Redis(short.into()));
        }
        Ok((flat, width))
    }

    /// Which requests of `rule` may share a script call with this one's:
    /// on a cluster, those whose keys hash to its slot; elsewhere, all.
    pub(crate) fn shard(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
    ) -> Shard {
        #[cfg(feature = "redis-cluster")]
        if let Conn::Cluster(_) = &self.inner.conn {
            let slot =
                redis::cluster_routing::Slot::for_key(self.state_key(rule, key, algorithm, quota));
            return Shard { slot: Some(slot) };
        }
        let _ = (rule, key, algorithm, quota);
        Shard::default()
    }

    /// Leases `need` units of `key`'s quota or none, up to `want`, to
    /// `holder` for at most `lease`, after giving back `back` units of its
    /// last lease (for a window, of the window it names): one `grant.lua`
    /// call on the state the rate script of `algorithm` keeps (the caller
    /// passes the quota the lease is counted in).
    pub(crate) async fn grant(
        &self,
        target: Target<'_>,
        key: &Key,
        ask: LeaseAsk<'_>,
        previous: Option<script::Previous>,
    ) -> Result<Grant, RedisBackendError> {
        let Target {
            rule,
            algorithm,
            quota,
            ..
        } = target;
        let redis_key = self.state_key(rule, key, algorithm, quota);
        let previous = previous.map(|p| (self.old_keys(rule, key, algorithm, quota, &p), p));
        let invocation = script::grant(algorithm, redis_key, quota, ask, previous);
        let reply: script::GrantReply = self.invoke(&invocation).await?;
        Ok(script::grant_reply(reply))
    }

    /// The keys a rate script declares for `key`: its state and its lock,
    /// and its state under the rule's previous quota.
    fn batch_keys(
        &self,
        target: Target<'_>,
        key: &Key,
        previous: Option<&script::Previous>,
    ) -> script::BatchKeys {
        let Target {
            rule,
            algorithm,
            quota,
            locks,
        } = target;
        let lock = locks
            .read
            .then(|| keys::tagged_key(&self.inner.prefix, rule, key, keys::LOCK));
        let old = previous.map_or_else(Vec::new, |p| self.old_keys(rule, key, algorithm, quota, p));
        (self.state_key(rule, key, algorithm, quota), lock, old)
    }

    /// `key`'s states under the previous quotas of a rolling rule (a
    /// calendar count has one state, whatever the limit).
    fn old_keys(
        &self,
        rule: &str,
        key: &Key,
        algorithm: Algorithm,
        quota: &Quota,
        previous: &script::Previous,
    ) -> Vec<Vec<u8>> {
        if quota.period().is_some() {
            return Vec::new();
        }
        previous
            .quotas()
            .map(|q| self.state_key(rule, key, algorithm, q))
            .collect()
    }

    /// The key a rate script keeps `key`'s state in.
    fn state_key(&self, rule: &str, key: &Key, algorithm: Algorithm, quota: &Quota) -> Vec<u8> {
        let prefix = &self.inner.prefix;
        if quota.period().is_some() {
            keys::tagged_key(prefix, rule, key, keys::CALENDAR)
        } else {
            keys::redis_key(prefix, rule, key, algorithm, quota)
        }
    }

    /// Runs the control handle's `op` on `key`: for an adjustment or a
    /// read, what a request of one unit would be told now, and whether the
    /// adjustment was void (its window had ended). `converts` and
    /// `previous`: see [`script::control`].
    pub(crate) async fn control(
        &self,
        target: Target<'_>,
        key: &Key,
        op: ControlOp,
        (converts, previous): (bool, Option<script::Previous>),
    ) -> Result<(Decision, bool), RedisBackendError> {
        let Target {
            rule,
            algorithm,
            quota,
            ..
        } = target;
        let redis_key = self.state_key(rule, key, algorithm, quota);
        let previous = previous.map(|p| (self.old_keys(rule, key, algorithm, quota, &p), p));
        let invocation = script::control(algorithm, redis_key, quota, op, converts, previous);
        let reply: script::ControlReply = self.invoke(&invocation).await?;
        Ok(script::control_decision(quota, reply))
    }

    /// Enters `quota` (as Redis counts `rule`'s rolling states) in the
    /// rule's record of the quotas in play for `lasts` from now, and reads
    /// the others (ADR 33).
    pub(crate) async fn quotas_in_play(
        &self,
        rule: &str,
        algorithm: Algorithm,
        quota: &Quota,
        lasts: Duration,
    ) -> Result<script::Record, RedisBackendError> {
        let key = keys::tagged_key(&self.inner.prefix, rule, &Key::new(""), keys::QUOTAS);
        let own = keys::state_suffix(algorithm, quota);
        let ms = u64::try_from(lasts.as_millis()).unwrap_or(u64::MAX);
        let flat: Vec<String> = self.invoke(&script::record::enter(key, &own, ms)).await?;
        script::record::parse(&flat, &own).ok_or_else(|| {
            let kind = (redis::ErrorKind::UnexpectedReturnType, "a record of quotas");
            RedisBackendError::Redis(kind.into())
        })
    }

    /// Runs `slot.lua` on the slot set of `key` under the concurrency
    /// limit `limit`; see [`ConcurrencyLimitBuilder::global`](crate::concurrency::ConcurrencyLimitBuilder::global).
    pub(crate) async fn slot(
        &self,
        limit: &str,
        key: &Key,
        op: SlotOp<'_>,
    ) -> Result<SlotReply, RedisBackendError> {
        let inner = &*self.inner;
        let redis_key = keys::tagged_key(&inner.prefix, limit, key, keys::SLOTS);
        let reply = self.invoke(&script::slot(redis_key, op)).await?;
        Ok(script::slot_reply(reply))
    }

    /// Renews every slot in `ids` on `key`'s slot set in one call: which
    /// of them were still held (and are now extended by `ttl`).
    pub(crate) async fn renew_slots<S: AsRef<str>>(
        &self,
        limit: &str,
        key: &Key,
        ids: &[S],
        ttl: Duration,
    ) -> Result<Vec<bool>, RedisBackendError> {
        let inner = &*self.inner;
        let redis_key = keys::tagged_key(&inner.prefix, limit, key, keys::SLOTS);
        let held: Vec<i64> = self.invoke(&script::renew(redis_key, ids, ttl)).await?;
        Ok(held.into_iter().map(|h| h == 1).collect())
    }

    /// The one path every script takes: `EVALSHA`, and `SCRIPT LOAD` after
    /// `NOSCRIPT`. A flush can land between the load and the retry (Redis
    /// restarting, `SCRIPT FLUSH` in a loop): a few more rounds, then the error.
    pub(super) async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisBackendError> {
        self.inner
            .conn
            .invoke(Some(&self.inner.reachability), Call::Invocation(invocation))
            .await
    }

    /// [`invoke`](Self::invoke) for a call written straight into its
    /// command.
    pub(super) async fn eval<T: redis::FromRedisValue>(
        &self,
        eval: &script::Eval,
    ) -> Result<T, RedisBackendError> {
        self.inner
            .conn
            .invoke(Some(&self.inner.reachability), Call::Eval(eval))
            .await
    }

    pub(super) async fn load_scripts(&self) -> Result<(), RedisBackendError> {
        for source in script::SOURCES.into_iter().chain([script::MULTI.1]) {
            let mut load = redis::cmd("SCRIPT");
            load.arg("LOAD").arg(source);
            self.inner.conn.query::<redis::Value>(&load).await?;
        }
        Ok(())
    }

    /// Whether both are handles to one backend (one connection set).
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// How many gateways announced themselves within the TTL at the last
    /// count ([`RedisBackendBuilder::live_instances`](super::RedisBackendBuilder::live_instances)); `None` when the
    /// count is not kept or none was read yet.
    pub fn live_instances(&self) -> Option<u32> {
        self.inner.membership.as_ref()?.count.read()
    }

    /// The live count the failure mode divides by, when it is kept.
    pub(crate) fn live_count(&self) -> Option<Arc<LiveCount>> {
        Some(self.inner.membership.as_ref()?.count.clone())
    }

    /// Replies and pongs, so a guarded call can tell a busy reader from a
    /// silent server.
    pub(crate) fn reachability(&self) -> &Reachability {
        &self.inner.reachability
    }
}
