#![doc = include_str!("../../docs/config.md")]

mod check;
mod error;
mod parse;
mod registry;
mod schema;
mod watch;

use std::path::Path;

#[cfg(feature = "redis")]
use crate::failure::BreakerConfig;
use crate::key::{KeyExtractor, TrustedProxies};
use crate::rule::{Lockout, OnMissingKey};
use crate::{HeaderStyle, RateLimitBuilder, RateLimitLayer, ResetFormat, Rule};
pub use error::ConfigError;
use parse::{KeyAtom, KeySpec, MissingSpec};
pub use registry::Registry;
use registry::lookup;
use schema::RuleConfig;
pub use schema::RulesConfig;
use schema::ScopeSpec;
pub use watch::ConfigWatcher;

impl RulesConfig {
    /// Reads a TOML configuration.
    ///
    /// # Errors
    ///
    /// Invalid TOML, unknown fields, or a bad value, with its line and column.
    pub fn from_toml_str(src: &str) -> Result<Self, ConfigError> {
        toml::from_str(src).map_err(|e| {
            let Some(span) = e.span() else {
                return ConfigError::new(e.message());
            };
            let before = &src[..span.start.min(src.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            ConfigError::at(e.message().trim_end(), src, line, column)
        })
    }

    /// Reads a YAML configuration.
    ///
    /// # Errors
    ///
    /// Invalid YAML, unknown fields, or a bad value, with its line and column.
    pub fn from_yaml_str(src: &str) -> Result<Self, ConfigError> {
        serde_norway::from_str(src).map_err(|e| {
            let text = e.to_string();
            match e.location() {
                Some(loc) => {
                    // The message already names the path; drop its own " at line …".
                    let msg = text.rsplit_once(" at line ").map_or(&*text, |(m, _)| m);
                    ConfigError::at(msg, src, loc.line(), loc.column())
                }
                None => ConfigError::new(text),
            }
        })
    }

    /// Reads a file: YAML when it ends in `.yaml` or `.yml`, TOML otherwise.
    ///
    /// # Errors
    ///
    /// The file can't be read, or [`from_toml_str`](Self::from_toml_str) /
    /// [`from_yaml_str`](Self::from_yaml_str) fails; the message starts with the path.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        Self::from_named_str(path, &src)
    }

    /// Parses `src`, read from `path`: YAML or TOML by the extension, with
    /// the path in front of any error.
    fn from_named_str(path: &Path, src: &str) -> Result<Self, ConfigError> {
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        let parsed = if yaml {
            Self::from_yaml_str(src)
        } else {
            Self::from_toml_str(src)
        };
        parsed.map_err(|e| e.in_file(path))
    }

    /// The rules' names, in evaluation order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.raw.name.as_str())
    }

    /// A builder with the file's rules and settings, to add more (e.g. a
    /// [`deny_response`](RateLimitBuilder::deny_response)) before building.
    ///
    /// ```
    /// use keyed_rate_limit::{Quota, Rule, config::{Registry, RulesConfig}, key::KeyExtractor};
    ///
    /// let config = RulesConfig::from_toml_str("[[rules]]\nname = \"ip\"\nkey = \"peer_ip\"\nquota = \"10/s\"\n")?;
    /// let layer = config
    ///     .into_builder(&Registry::new())?
    ///     .rule(Rule::new("everyone", KeyExtractor::global(), Quota::per_second(1000)))
    ///     .build()?;
    /// assert_eq!(layer.rules().len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A name the registry doesn't hold, or a global rule without
    /// [`Registry::redis`].
    pub fn into_builder(self, registry: &Registry) -> Result<RateLimitBuilder, ConfigError> {
        let mut builder = RateLimitLayer::builder()
            .headers(self.headers)
            .legacy_reset(self.legacy_reset);
        if let Some(n) = self.instances {
            builder = builder.instances(n);
        }
        if let Some(n) = self.max_key_len {
            builder = builder.max_key_len(n);
        }
        Ok(builder.rules(self.into_rules(registry)?))
    }

    /// The file's rules, built with `registry`.
    fn into_rules(self, registry: &Registry) -> Result<Vec<Rule>, ConfigError> {
        self.rules
            .into_iter()
            .map(|rule| {
                let name = rule.raw.name.clone();
                rule.into_rule(registry)
                    .map_err(|e| ConfigError::new(format!("rule {name:?}: {e}")))
            })
            .collect()
    }

    /// The settings of the layer as a whole, which a reload can't change.
    fn layer_settings(&self) -> (HeaderStyle, ResetFormat, Option<u32>, Option<usize>) {
        (
            self.headers,
            self.legacy_reset,
            self.instances,
            self.max_key_len,
        )
    }

    /// [`into_builder`](Self::into_builder), then
    /// [`build`](RateLimitBuilder::build).
    ///
    /// # Errors
    ///
    /// As [`into_builder`](Self::into_builder), and any [`BuildError`](crate::error::BuildError).
    pub fn into_layer(self, registry: &Registry) -> Result<RateLimitLayer, ConfigError> {
        Ok(self.into_builder(registry)?.build()?)
    }
}

impl RuleConfig {
    fn into_rule(self, reg: &Registry) -> Result<Rule, String> {
        let Self { raw, proxies } = self;
        let key = key_extractor(&raw.key, proxies.as_ref(), reg)?;
        let quota = raw.static_quota();
        let mut rule = Rule::new(raw.name, key, quota)
            .algorithm(raw.algorithm)
            .shadow(raw.shadow)
            .headers(raw.headers)
            .partition_key(raw.partition_key)
            .split_across_instances(raw.split_across_instances);
        if let Some(name) = raw.quota_fn {
            let f = lookup(&reg.quotas, "quota_fn", &name)?.clone();
            rule = rule.quota_fn(move |p| f(p));
        }
        if let Some(cost) = raw.cost {
            rule = rule.cost(cost);
        }
        if let Some(n) = raw.max_keys {
            rule = rule.max_keys(n);
        }
        if let Some(l) = raw.lockout {
            rule = rule.lockout(Lockout::new(l.after, l.within.0, l.block_for.0));
        }
        if let Some(policy) = raw.on_key_space_full {
            rule = rule.on_key_space_full(policy);
        }
        if let Some(name) = raw.cost_fn {
            let f = lookup(&reg.costs, "cost_fn", &name)?.clone();
            rule = rule.cost_fn(move |p| f(p));
        }
        if let Some(m) = raw.on_missing_key {
            rule = rule.on_missing_key(match m {
                MissingSpec::Skip => OnMissingKey::Skip,
                MissingSpec::Reject(status) => OnMissingKey::Reject(status),
                MissingSpec::Fallback(k) => {
                    OnMissingKey::Fallback(key_extractor(&k, proxies.as_ref(), reg)?)
                }
            });
        }
        #[cfg(not(feature = "redis"))]
        if raw.scope == ScopeSpec::Global {
            return Err("`scope = \"global\"` needs the crate's `redis` feature".into());
        }
        #[cfg(feature = "redis")]
        if raw.scope == ScopeSpec::Global {
            let redis = reg.redis.clone().ok_or(
                "`scope = \"global\"` needs a Redis backend: pass one with `Registry::redis`",
            )?;
            rule = rule.global(redis);
            if let Some(mode) = raw.failure_mode {
                rule = rule.on_redis_failure(mode);
            }
            if let Some(t) = raw.timeout {
                rule = rule.redis_timeout(t.0);
            }
            if let Some(on) = raw.coalesce {
                rule = rule.coalesce(on);
            }
            if let Some(l) = raw.lease {
                rule = rule.lease(l.policy());
            }
            if let Some(b) = raw.breaker {
                let mut cfg = BreakerConfig::default();
                if let Some(n) = b.failure_threshold {
                    cfg = cfg.failure_threshold(n);
                }
                if let Some(d) = b.open_for {
                    cfg = cfg.open_for(d.0);
                }
                rule = rule.circuit_breaker(cfg);
            }
        }
        Ok(rule)
    }
}

/// Builds the extractor a key spec names: alternatives joined with
/// [`KeyExtractor::or`], parts with [`KeyExtractor::and`].
fn key_extractor(
    spec: &KeySpec,
    proxies: Option<&TrustedProxies>,
    reg: &Registry,
) -> Result<KeyExtractor, String> {
    let atom = |a: &KeyAtom| -> Result<KeyExtractor, String> {
        Ok(match a {
            KeyAtom::Header(h) => KeyExtractor::header(h.as_str()),
            KeyAtom::Extension(name) => lookup(&reg.keys, "key", name)?.clone(),
            KeyAtom::PeerIp => KeyExtractor::peer_ip(),
            // The rule checked that `client_ip` comes with proxies.
            KeyAtom::ClientIp => KeyExtractor::client_ip(proxies.cloned().unwrap_or_else(|| {
                TrustedProxies::new::<_, &str>([]).expect("no proxies is valid")
            })),
            KeyAtom::MatchedRoute => KeyExtractor::matched_route(),
            KeyAtom::Global => KeyExtractor::global(),
        })
    };
    let join = |parts: &[KeyAtom], f: fn(KeyExtractor, KeyExtractor) -> KeyExtractor| {
        parts.iter().map(atom).try_fold(None, |acc, k| {
            let k = k?;
            Ok::<_, String>(Some(match acc {
                None => k,
                Some(a) => f(a, k),
            }))
        })
    };
    let mut out: Option<KeyExtractor> = None;
    for alt in &spec.0 {
        let k = join(alt, KeyExtractor::and)?.ok_or("empty key")?;
        out = Some(match out {
            None => k,
            Some(a) => a.or(k),
        });
    }
    out.ok_or_else(|| "empty key".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn toml_err(src: &str) -> ConfigError {
        RulesConfig::from_toml_str(src).unwrap_err()
    }

    #[test]
    fn toml_positions() {
        let e =
            toml_err("[[rules]]\nname = \"a\"\nkey = \"global\"\nquota = \"5/min\"\nbrust = 3\n");
        assert_eq!((e.line(), e.column()), (Some(5), Some(1)));
        assert!(e.message().contains("unknown field `brust`"), "{e}");
        let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"ip\"\nquota = \"5/min\"\n");
        assert_eq!((e.line(), e.column()), (Some(3), Some(7)));
    }

    #[test]
    fn yaml_positions() {
        let e = RulesConfig::from_yaml_str(
            "rules:\n  - name: a\n    key: global\n    quota: 5/fortnight\n",
        )
        .unwrap_err();
        assert_eq!((e.line(), e.column()), (Some(4), Some(12)));
        assert!(
            e.message().starts_with("rules[0].quota: invalid quota"),
            "{e}"
        );
    }

    #[test]
    fn calendar_quotas() {
        let config = RulesConfig::from_toml_str(
            "[[rules]]\nname = \"m\"\nkey = \"global\"\nquota = \"9/calendar_month\"\nutc_offset = \"-08:00\"\n",
        )
        .unwrap();
        let layer = config.into_layer(&Registry::new()).unwrap();
        let q = layer.rules()[0].static_quota();
        assert_eq!(q, Some(Quota::per_month(9).with_utc_offset(-8 * 3600)));
        let e = toml_err(
            "[[rules]]\nname = \"m\"\nkey = \"global\"\nquota = \"9/min\"\nutc_offset = \"+01:00\"\n",
        );
        assert!(
            e.message().contains("a UTC offset needs a calendar quota"),
            "{e}"
        );
        assert_eq!(e.line(), Some(1));
        let e = toml_err(
            "[[rules]]\nname = \"m\"\nkey = \"global\"\nquota = \"9/calendar_day\"\nutc_offset = \"+1:00\"\n",
        );
        assert_eq!((e.line(), e.column()), (Some(5), Some(14)), "{e}");
    }

    #[test]
    fn rule_checks() {
        let base = "[[rules]]\nname = \"a\"\nkey = \"global\"\n";
        let cases = [
            ("", "missing field `quota` (or `quota_fn`)"),
            ("quota = \"1/s\"\nquota_fn = \"p\"\n", "not both"),
            (
                "quota_fn = \"p\"\nburst = 3\n",
                "`burst` needs a static `quota`",
            ),
            ("quota = \"1/s\"\nburst = 0\n", "the burst is zero"),
            (
                "quota = \"1/s\"\ntimeout = \"5ms\"\n",
                "`timeout` only applies",
            ),
            (
                "quota = \"1/s\"\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
                "needs a `client_ip` key",
            ),
        ];
        for (extra, want) in cases {
            let e = toml_err(&format!("{base}{extra}"));
            assert!(e.message().contains(want), "{want}: {e}");
            assert!(e.message().contains("rule \"a\""), "{e}");
            assert!(e.line().is_some(), "{e}");
        }
        let e = toml_err("[[rules]]\nname = \"a\"\nkey = \"client_ip\"\nquota = \"1/s\"\n");
        assert!(e.message().contains("needs `trusted_proxies`"), "{e}");
    }

    #[test]
    fn registry_errors() {
        let cfg = |s: &str| RulesConfig::from_toml_str(s).unwrap();
        let e = cfg("[[rules]]\nname = \"a\"\nkey = \"extension:user\"\nquota = \"1/s\"\n")
            .into_builder(&Registry::new().key("tenant", KeyExtractor::global()))
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            "rule \"a\": `key`: the registry has no \"user\" (it has: tenant)"
        );
        let e =
            cfg("[[rules]]\nname = \"a\"\nkey = \"global\"\nquota = \"1/s\"\nscope = \"global\"\n")
                .into_builder(&Registry::new())
                .err()
                .unwrap();
        assert!(e.to_string().contains("needs a Redis backend"), "{e}");
        let e = cfg("[[rules]]\nname = \"a\"\nkey = \"global\"\nquota = \"1/s\"\nalgorithm = \"fixed_window\"\n")
            .into_layer(&Registry::new())
            .unwrap_err();
        assert!(e.to_string().contains("fixed_window needs a global"), "{e}");
    }
}
