//! Whether the server may evict limit state (`maxmemory-policy`).

use super::backend::RedisBackend;

impl RedisBackend {
    /// Reads `maxmemory-policy` and warns (`tracing::warn!`, target
    /// `keyed_rate_limit`) when Redis may evict limit state, which silently
    /// resets a key's limit: `allkeys-*` evicts any key, and `volatile-*`
    /// evicts ours too since they all have a TTL.
    ///
    /// Returns the policy, or `None` when it cannot be read (e.g. `CONFIG` is
    /// renamed or denied by ACL, as on many managed services).
    /// [`RedisBackendBuilder::build`](super::RedisBackendBuilder::build) reads it once, and each global rule
    /// or concurrency limit built on this backend then warns under its name.
    pub async fn eviction_policy_warning(&self) -> Option<String> {
        let policy = self.read_eviction_policy().await?;
        if evicts(&policy) {
            tracing::warn!(
                target: crate::observe::TARGET,
                maxmemory_policy = %policy,
                "redis may evict rate-limit keys under memory pressure, resetting their limits; \
                 use maxmemory-policy noeviction"
            );
        }
        Some(policy)
    }

    pub(super) async fn read_eviction_policy(&self) -> Option<String> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory-policy");
        let policy = match self.inner.conn.query::<Vec<String>>(&cmd).await {
            Ok(pair) => pair.into_iter().nth(1)?,
            Err(e) => {
                tracing::debug!(target: crate::observe::TARGET, error = %e, "cannot read redis maxmemory-policy");
                return None;
            }
        };
        let _ = self.inner.eviction_policy.set(policy.clone());
        Some(policy)
    }

    /// The `maxmemory-policy` read at build, when it may evict limit state.
    pub(crate) fn evicting_policy(&self) -> Option<&str> {
        self.inner
            .eviction_policy
            .get()
            .map(String::as_str)
            .filter(|p| evicts(p))
    }
}

fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}
