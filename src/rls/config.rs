//! envoyproxy/ratelimit's YAML configuration, read into a descriptor tree
//! per domain whose limits are the crate's rules.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::algorithm::Algorithm;
use crate::config::ConfigError;
use crate::policy::FailureMode;
use crate::quota::Quota;

/// One or more domains read from envoyproxy/ratelimit's YAML files, with
/// this crate's extensions; see the [module page](super) for the format.
///
/// ```
/// use keyed_rate_limit::rls::RlsConfig;
///
/// let config = RlsConfig::from_yaml_str(
///     "domain: edge\n\
///      descriptors:\n\
///      \x20 - key: remote_address\n\
///      \x20   rate_limit: { unit: minute, requests_per_unit: 60 }\n",
/// )
/// .unwrap();
/// assert_eq!(config.domains().collect::<Vec<_>>(), ["edge"]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct RlsConfig {
    pub(super) domains: BTreeMap<String, Vec<Node>>,
}

/// A descriptor entry of the configuration, and what lies below it.
#[derive(Clone, Debug)]
pub(super) struct Node {
    pub(super) key: String,
    pub(super) value: Match,
    pub(super) limit: Option<Limit>,
    pub(super) children: Vec<Node>,
    /// Where the entry is, for errors found when its rule is built.
    pub(super) path: String,
}

/// Which values of its key a node takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Match {
    /// `key` with no `value`: every value, one counter each.
    Any,
    /// `value: foo`.
    Exact(String),
    /// `value: foo*`: every value starting with `foo`, one counter each.
    Prefix(String),
}

/// The limit of a node.
#[derive(Clone, Debug)]
pub(super) struct Limit {
    pub(super) kind: LimitKind,
    /// `rate_limit.name`, for `replaces`.
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) unit: Unit,
    pub(super) requests_per_unit: u32,
}

#[derive(Clone, Debug)]
pub(super) enum LimitKind {
    /// `unlimited: true`: counted by nobody, never over.
    Unlimited,
    /// `requests_per_unit: 0`: every request over.
    Blocked,
    /// A rule of the layer.
    Rule(RuleSpec),
}

/// What the layer's rule for a limit is made of.
#[derive(Clone, Debug)]
pub(super) struct RuleSpec {
    pub(super) quota: Quota,
    pub(super) shadow: bool,
    pub(super) algorithm: Option<Algorithm>,
    pub(super) global: bool,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) failure_mode: Option<FailureMode>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) lease: Option<crate::config::LeaseSpec>,
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(super) coalesce: Option<bool>,
}

/// envoyproxy/ratelimit's units. A month is 30 days and a year 365, as
/// envoyproxy/ratelimit counts them, unless the extension `calendar: true`
/// makes a day or a month a calendar one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub(super) fn length(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDomain {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: String,
    value: Option<String>,
    rate_limit: Option<RawLimit>,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted as envoyproxy/ratelimit has it; every rule is counted
    /// per rule anyway (`rate_limit_decisions_total`).
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    // This crate's extensions.
    algorithm: Option<Algorithm>,
    burst: Option<u32>,
    #[serde(default)]
    calendar: bool,
    scope: Option<RawScope>,
    failure_mode: Option<FailureMode>,
    lease: Option<crate::config::LeaseSpec>,
    coalesce: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    unit: Unit,
    requests_per_unit: u32,
    #[serde(default)]
    unlimited: bool,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: String,
}

#[derive(Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RawScope {
    Local,
    Global,
}

impl RlsConfig {
    /// Reads one domain's YAML, as envoyproxy/ratelimit's files hold it.
    ///
    /// # Errors
    ///
    /// Invalid YAML, an unknown field, a bad value or a bad descriptor, with
    /// its line and column.
    pub fn from_yaml_str(src: &str) -> Result<Self, ConfigError> {
        let raw: RawDomain =
            serde_norway::from_str(src).map_err(|e| crate::config::yaml_error(&e, src))?;
        let mut config = Self::default();
        config.add(raw, src)?;
        Ok(config)
    }

    /// Reads a YAML file of one domain.
    ///
    /// # Errors
    ///
    /// The file can't be read, or [`from_yaml_str`](Self::from_yaml_str)
    /// fails; the message starts with the path.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        Self::from_yaml_str(&src).map_err(|e| e.in_file(path))
    }

    /// Both configurations' domains, as envoyproxy/ratelimit loads a
    /// directory of files.
    ///
    /// # Errors
    ///
    /// A domain that both define.
    pub fn merge(mut self, other: RlsConfig) -> Result<Self, ConfigError> {
        for (domain, nodes) in other.domains {
            if self.domains.contains_key(&domain) {
                return Err(ConfigError::new(format!(
                    "domain {domain:?} is defined twice"
                )));
            }
            self.domains.insert(domain, nodes);
        }
        Ok(self)
    }

    /// The domains, in order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    fn add(&mut self, raw: RawDomain, src: &str) -> Result<(), ConfigError> {
        if raw.domain.is_empty() {
            return Err(ConfigError::at("`domain` is empty", src, 1, 1));
        }
        let mut nodes = Vec::new();
        for d in raw.descriptors {
            nodes.push(node(d, &raw.domain, src)?);
        }
        if self.domains.insert(raw.domain.clone(), nodes).is_some() {
            return Err(ConfigError::new(format!(
                "domain {:?} is defined twice",
                raw.domain
            )));
        }
        Ok(())
    }
}

/// Where `needle` first appears in `src` at or after `from`, as a line and
/// column: semantic errors point at their descriptor's `key`.
fn locate(src: &str, key: &str, value: Option<&str>) -> (usize, usize) {
    let probe = format!("key: {key}");
    let mut best = None;
    for (at, _) in src.match_indices(&probe) {
        let after = &src[at..];
        let window = &after[..after.len().min(400)];
        if value.is_none_or(|v| window.contains(v)) {
            best = Some(at);
            break;
        }
        best.get_or_insert(at);
    }
    let at = best.unwrap_or(0);
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let column = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

fn node(raw: RawDescriptor, parent: &str, src: &str) -> Result<Node, ConfigError> {
    let (line, column) = locate(src, &raw.key, raw.value.as_deref());
    let fail = |msg: String| ConfigError::at(msg, src, line, column);
    if raw.key.is_empty() {
        return Err(fail("descriptor `key` is empty".into()));
    }
    let value = match raw.value {
        None => Match::Any,
        Some(v) if v.ends_with('*') => Match::Prefix(v.trim_end_matches('*').to_owned()),
        Some(v) => Match::Exact(v),
    };
    let path = match &value {
        Match::Any => format!("{parent}.{}", raw.key),
        Match::Exact(v) => format!("{parent}.{}_{v}", raw.key),
        Match::Prefix(v) => format!("{parent}.{}_{v}*", raw.key),
    };
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains(['{', '}']) {
        return Err(fail(format!(
            "descriptor {path:?}: keys and values name the rule, so they are printable ASCII without spaces or braces"
        )));
    }
    if (raw.lease.is_some() || raw.coalesce.is_some()) && raw.scope != Some(RawScope::Global) {
        return Err(fail(format!(
            "descriptor {path:?}: `lease` and `coalesce` need `scope: global`"
        )));
    }
    let limit = match raw.rate_limit {
        None => None,
        Some(l) => {
            let kind = if l.unlimited {
                LimitKind::Unlimited
            } else if l.requests_per_unit == 0 {
                LimitKind::Blocked
            } else {
                let n = l.requests_per_unit;
                let quota = match (raw.calendar, l.unit) {
                    (true, Unit::Day) => Quota::per_day(n),
                    (true, Unit::Month) => Quota::per_month(n),
                    (true, other) => {
                        return Err(fail(format!(
                            "`calendar: true` needs unit day or month, not {other:?}"
                        )));
                    }
                    (false, unit) => Quota::new(n, unit.length()),
                };
                let quota = match raw.burst {
                    Some(b) => quota.with_burst(b),
                    None => quota,
                };
                LimitKind::Rule(RuleSpec {
                    quota,
                    shadow: raw.shadow_mode,
                    algorithm: raw.algorithm,
                    global: raw.scope == Some(RawScope::Global),
                    failure_mode: raw.failure_mode,
                    lease: raw.lease,
                    coalesce: raw.coalesce,
                })
            };
            Some(Limit {
                kind,
                name: l.name,
                replaces: l.replaces.into_iter().map(|r| r.name).collect(),
                unit: l.unit,
                requests_per_unit: l.requests_per_unit,
            })
        }
    };
    let mut children = Vec::new();
    for d in raw.descriptors {
        children.push(node(d, &path, src)?);
    }
    Ok(Node {
        key: raw.key,
        value,
        limit,
        children,
        path,
    })
}

/// The node a descriptor's entries lead to, matched by depth: at each
/// depth a `key` with its exact `value` first, then a value wildcard, then
/// the `key` alone.
pub(super) fn find<'a>(mut nodes: &'a [Node], entries: &[(&str, &str)]) -> Option<&'a Node> {
    let mut found = None;
    for (key, value) in entries {
        let same_key = || nodes.iter().filter(|n| n.key == *key);
        let node = same_key()
            .find(|n| n.value == Match::Exact((*value).to_owned()))
            .or_else(|| {
                same_key()
                    .find(|n| matches!(&n.value, Match::Prefix(p) if value.starts_with(p.as_str())))
            })
            .or_else(|| same_key().find(|n| n.value == Match::Any))?;
        found = Some(node);
        nodes = &node.children;
    }
    found
}
