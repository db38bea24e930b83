//! `[[bandwidth]]` entries into [`BandwidthLimitLayer`]s, with the
//! registry's extractors and Redis backend and the file's layer settings.

use crate::bandwidth::{BandwidthLimitBuilder, BandwidthLimitLayer};

use super::build::{SetIfAny, key_extractor, on_missing};
use super::check::proxies;
use super::error::ConfigError;
use super::registry::Registry;
use super::schema::{BandwidthConfig, RulesConfig, ScopeSpec};

impl RulesConfig {
    /// The names of the file's `[[bandwidth]]` entries, in file order.
    ///
    /// ```
    /// use keyed_rate_limit::RulesConfig;
    /// let config = RulesConfig::from_toml_str(r#"
    ///     rules = []
    ///     [[bandwidth]]
    ///     name = "downloads"
    ///     key = "header:x-api-key"
    ///     bytes_per_second = 1048576
    /// "#)?;
    /// assert_eq!(config.bandwidth_names().collect::<Vec<_>>(), ["downloads"]);
    /// # Ok::<(), keyed_rate_limit::config::ConfigError>(())
    /// ```
    pub fn bandwidth_names(&self) -> impl Iterator<Item = &str> {
        self.bandwidth.iter().map(|b| b.name.as_str())
    }

    /// Builds the `[[bandwidth]]` entry named `name`, with the file's
    /// `headers`, `instances` and `max_key_len`. Entries are read when the
    /// layer is built: [`watch`](Self::watch) reloads rules, not these.
    ///
    /// ```
    /// use axum::{Router, routing::get};
    /// use keyed_rate_limit::bandwidth::Direction;
    /// use keyed_rate_limit::{Registry, RulesConfig};
    ///
    /// let config = RulesConfig::from_toml_str(r#"
    ///     [[rules]]
    ///     name = "per-key"
    ///     key = "header:x-api-key"
    ///     quota = "100/min"
    ///
    ///     [[bandwidth]]
    ///     name = "downloads"
    ///     key = "header:x-api-key"
    ///     bytes_per_second = 1048576   # 1 MiB/s per key
    ///     burst = 65536
    ///     direction = "response"       # response (default) | request | both
    ///     on_missing_key = "reject:401"
    /// "#)?;
    /// let downloads = config.bandwidth_layer("downloads", &Registry::new())?;
    /// assert_eq!((downloads.bytes_per_second(), downloads.direction()), (1 << 20, Direction::Response));
    /// let app: Router = Router::new()
    ///     .route("/files", get(|| async { "..." }))
    ///     .layer(downloads)
    ///     .layer(config.into_layer(&Registry::new())?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// No entry named `name`; a name the registry doesn't hold, a global
    /// entry without [`Registry::redis`] (or the `redis` feature); a
    /// `client_ip` key without `trusted_proxies`; any
    /// [`BuildError`](crate::error::BuildError) of the layer.
    pub fn bandwidth_layer(
        &self,
        name: &str,
        registry: &Registry,
    ) -> Result<BandwidthLimitLayer, ConfigError> {
        let Some(entry) = self.bandwidth.iter().find(|b| b.name == name) else {
            return Err(ConfigError::new(format!(
                "no [[bandwidth]] entry named {name:?}"
            )));
        };
        // Placed at the entry's `name`: after the rules that share it.
        let nth = self.rules.iter().filter(|r| r.raw.name == name).count();
        let placed = |e: String| {
            self.origin
                .rule_error(name, nth, format!("bandwidth {name:?}: {e}"))
        };
        let b = entry.builder(registry).map_err(placed)?;
        b.headers(self.headers)
            .set(self.instances, BandwidthLimitBuilder::instances)
            .set(self.max_key_len, BandwidthLimitBuilder::max_key_len)
            .build()
            .map_err(|e| placed(e.to_string()))
    }
}

impl BandwidthConfig {
    fn builder(&self, reg: &Registry) -> Result<BandwidthLimitBuilder, String> {
        let fallback = self.on_missing_key.as_ref();
        let proxies = proxies(&self.key, fallback, self.trusted_proxies.as_ref())?;
        let key = key_extractor(&self.key, proxies.as_ref(), reg)?;
        let mut b = BandwidthLimitLayer::builder(self.name.as_str(), key, self.bytes_per_second)
            .direction(self.direction)
            .set(self.burst, BandwidthLimitBuilder::burst)
            .set(self.max_keys, BandwidthLimitBuilder::max_keys);
        if let Some(m) = &self.on_missing_key {
            b = b.on_missing_key(on_missing(m, proxies.as_ref(), reg)?);
        }
        let global_only = [
            (self.failure_mode.is_some(), "failure_mode"),
            (self.timeout.is_some(), "timeout"),
            (self.lease.is_some(), "lease"),
        ];
        if self.scope == ScopeSpec::Local {
            if let Some((_, field)) = global_only.iter().find(|(set, _)| *set) {
                return Err(format!("`{field}` only applies to `scope = \"global\"`"));
            }
            return Ok(b);
        }
        #[cfg(not(feature = "redis"))]
        return Err("`scope = \"global\"` needs the crate's `redis` feature".into());
        #[cfg(feature = "redis")]
        {
            let redis = reg.redis.clone().ok_or(
                "`scope = \"global\"` needs a Redis backend: pass one with `Registry::redis`",
            )?;
            Ok(b.global(redis)
                .set(self.failure_mode, BandwidthLimitBuilder::on_redis_failure)
                .set(self.timeout, |b, t| b.redis_timeout(t.0))
                .set(self.lease, |b, l| b.lease(l.policy())))
        }
    }
}
