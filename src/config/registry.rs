//! [`Registry`]: what code supplies to a configuration by name.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::request::Parts;

#[cfg(feature = "redis")]
use crate::backend::redis::RedisBackend;
use crate::key::KeyExtractor;
use crate::quota::Quota;

use crate::rule::{CostFn, QuotaFn};
use crate::settings::ExemptFn;

/// What code supplies to a configuration: named key extractors (for
/// `extension:<name>` keys), named quota and cost closures (for `quota_fn`
/// and `cost_fn`), and the Redis backend of global rules.
///
/// ```
/// use keyed_rate_limit::{Key, KeyExtractor, Quota, Registry};
///
/// #[derive(Clone)]
/// struct User { id: u64 }
///
/// let registry = Registry::new()
///     .key("user", KeyExtractor::extension::<User>(|u| Key::from(u.id)))
///     .quota_fn("plan", |parts| match parts.headers.get("x-plan") {
///         Some(v) if v == "pro" => Quota::per_minute(1000),
///         _ => Quota::per_minute(100),
///     })
///     .cost_fn("size", |parts| if parts.method == http::Method::POST { 5 } else { 1 });
/// # let _ = registry;
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    pub(super) keys: HashMap<String, KeyExtractor>,
    pub(super) quotas: HashMap<String, Arc<QuotaFn>>,
    pub(super) costs: HashMap<String, Arc<CostFn>>,
    pub(super) exempts: HashMap<String, Arc<ExemptFn>>,
    #[cfg(feature = "redis")]
    pub(super) redis: Option<RedisBackend>,
}

impl Registry {
    /// An empty registry: enough for files that use only built-in keys,
    /// static quotas and local rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// The extractor that `key = "extension:<name>"` refers to.
    pub fn key(mut self, name: impl Into<String>, extractor: KeyExtractor) -> Self {
        self.keys.insert(name.into(), extractor);
        self
    }

    /// The per-request quota that `quota_fn = "<name>"` refers to (see
    /// [`Rule::quota_fn`](crate::Rule::quota_fn)).
    pub fn quota_fn<F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Parts) -> Quota + Send + Sync + 'static,
    {
        self.quotas.insert(name.into(), Arc::new(f));
        self
    }

    /// The per-request cost that `cost_fn = "<name>"` refers to (see
    /// [`Rule::cost_fn`](crate::Rule::cost_fn)).
    pub fn cost_fn<F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.costs.insert(name.into(), Arc::new(f));
        self
    }

    /// The exemption that `exempt_fn = "<name>"` refers to: in a rule
    /// (see [`Rule::exempt`](crate::Rule::exempt)) or at the top of the
    /// file, for every rule (see
    /// [`RateLimitBuilder::exempt`](crate::rate_limit::RateLimitBuilder::exempt)).
    ///
    /// ```
    /// use keyed_rate_limit::{Registry, RulesConfig};
    /// let registry = Registry::new().exempt_fn("health", |parts| parts.uri.path() == "/healthz");
    /// let layer = RulesConfig::from_toml_str(
    ///     "exempt_fn = \"health\"\n[[rules]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"10/s\"\nexempt_ips = [\"10.0.0.0/8\"]\n",
    /// )?
    /// .into_layer(&registry)?;
    /// assert!(layer.describe().layer_exempt());
    /// # Ok::<(), keyed_rate_limit::config::ConfigError>(())
    /// ```
    pub fn exempt_fn<F>(mut self, name: impl Into<String>, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.exempts.insert(name.into(), Arc::new(f));
        self
    }

    /// The backend of every `scope = "global"` rule.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, backend: RedisBackend) -> Self {
        self.redis = Some(backend);
        self
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |m: Vec<&String>| {
            let mut v: Vec<_> = m.into_iter().cloned().collect();
            v.sort();
            v
        };
        let mut f = f.debug_struct("Registry");
        f.field("keys", &names(self.keys.keys().collect()))
            .field("quota_fns", &names(self.quotas.keys().collect()))
            .field("cost_fns", &names(self.costs.keys().collect()))
            .field("exempt_fns", &names(self.exempts.keys().collect()));
        #[cfg(feature = "redis")]
        f.field("redis", &self.redis);
        f.finish()
    }
}

/// The entry `name` of `map`, or an error for `field` that lists the names it has.
pub(super) fn lookup<'a, T>(
    map: &'a HashMap<String, T>,
    field: &str,
    name: &str,
) -> Result<&'a T, String> {
    map.get(name).ok_or_else(|| {
        let mut known: Vec<_> = map.keys().map(String::as_str).collect();
        known.sort_unstable();
        format!(
            "`{field}`: the registry has no {name:?} (it has: {})",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )
    })
}
