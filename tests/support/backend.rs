//! A `RedisBackend` on one of the harness's private servers.

/// A backend on a private server under its own key prefix.
pub trait Backend {
    /// Connects a [`RedisBackend`](keyed_rate_limit::RedisBackend) with this key prefix.
    async fn backend(&self, prefix: &str) -> keyed_rate_limit::RedisBackend;
}

impl Backend for keyed_rate_limit_testing::RedisServer {
    async fn backend(&self, prefix: &str) -> keyed_rate_limit::RedisBackend {
        keyed_rate_limit::RedisBackend::builder(self.url())
            .prefix(prefix)
            .build()
            .await
            .expect("connect to the private redis")
    }
}
