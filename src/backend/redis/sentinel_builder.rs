//! The builder's Sentinel entry point and options.

use super::backend::RedisBackend;
use super::builder::RedisBackendBuilder;
use super::endpoint::Topology;
use super::sentinel::Watched;

impl RedisBackend {
    /// Starts configuring a backend for the master that Redis Sentinel
    /// monitors as `master_name`, asked of any of `sentinels`
    /// (`redis://host:26379` URLs; a sentinel's own credentials go in its
    /// URL). The master is asked of the sentinels at start, and again when
    /// a call fails on a lost connection, is refused, or is answered
    /// `READONLY` or `MASTERDOWN` (the node was demoted), and in the
    /// background when a call times out; each answer is checked with
    /// `ROLE` before a script goes to it. See the module docs, "Redis
    /// Sentinel".
    ///
    /// ```
    /// use keyed_rate_limit::RedisBackend;
    /// let builder = RedisBackend::sentinel_builder(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    /// )
    /// .sentinel_master_auth(None, "master-password")
    /// .prefix("gateway-rl");
    /// ```
    pub fn sentinel_builder<I, S>(
        sentinels: I,
        master_name: impl Into<String>,
    ) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut b = Self::builder(String::new());
        b.endpoint.urls = sentinels.into_iter().map(Into::into).collect();
        b.endpoint.topology = Topology::Sentinel;
        b.endpoint.sentinel = Some(Watched {
            master_name: master_name.into(),
            ..Watched::default()
        });
        b
    }
}

impl RedisBackendBuilder {
    /// The credentials of the master (and replicas) found through the
    /// sentinels, which often differ from the sentinels' own (those go in
    /// their URLs). Only for [`RedisBackend::sentinel_builder`]; elsewhere
    /// `build` fails with [`RedisBackendError::Unsupported`](super::RedisBackendError::Unsupported).
    pub fn sentinel_master_auth(mut self, username: Option<&str>, password: &str) -> Self {
        let target = self.endpoint.sentinel.get_or_insert_with(Watched::default);
        target.username = username.map(str::to_owned);
        target.password = Some(password.to_owned());
        self
    }
}
