//! envoyproxy/ratelimit's YAML configuration, read into a descriptor tree
//! per domain whose limits are the crate's rules.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use keyed_rate_limit::Algorithm;
use keyed_rate_limit::Quota;
use keyed_rate_limit::config::ConfigError;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::rate_limit::RuleIndex;
use keyed_rate_limit::rule::LeasePolicy;

/// One or more domains read from envoyproxy/ratelimit's YAML files, with
/// this crate's extensions; see the [module page](super) for the format.
///
/// ```
/// use keyed_rls::RlsConfig;
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
    /// `share_threshold`: every value the wildcard matches counts in one
    /// counter, the pattern's.
    pub(super) shared: Option<String>,
    pub(super) limit: Option<Limit>,
    pub(super) children: Vec<Node>,
    /// Where the entry is, for errors found when its rule is built.
    pub(super) path: String,
    /// Its limit's rule in the service's chain, once a snapshot placed it.
    pub(super) rule: Option<RuleIndex>,
}

/// Which values of its key a node takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Match {
    /// `key` with no `value`: every value, one counter each.
    Any,
    /// `value: foo`.
    Exact(String),
    /// `value: foo*`, `bar*b`, `foo*bar*baz`: every value the pattern
    /// matches (each `*` any run of characters, the empty one too), one
    /// counter each, or one for them all with `share_threshold`; the
    /// pattern split at its `*`s.
    Wildcard(Vec<String>),
}

impl Match {
    /// Whether `value` matches, as envoyproxy/ratelimit's `wildcardMatch`
    /// decides: the first part a prefix, the last a suffix, the others in
    /// order between them, none overlapping.
    pub(super) fn matches(&self, value: &str) -> bool {
        match self {
            Match::Any => true,
            Match::Exact(v) => v == value,
            Match::Wildcard(parts) => {
                let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
                    return false;
                };
                let fixed: usize = parts.iter().map(String::len).sum();
                if value.len() < fixed
                    || !value.starts_with(first.as_str())
                    || !value.ends_with(last.as_str())
                {
                    return false;
                }
                let mut rest = &value[first.len()..value.len() - last.len()];
                for part in &parts[1..parts.len() - 1] {
                    match rest.find(part.as_str()) {
                        Some(at) => rest = &rest[at + part.len()..],
                        None => return false,
                    }
                }
                true
            }
        }
    }
}

/// The limit of a node.
#[derive(Clone, Debug)]
pub(super) struct Limit {
    pub(super) kind: LimitKind,
    /// `rate_limit.name`, for `replaces`.
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) unit: TimeUnit,
    pub(super) requests_per_unit: u32,
    /// `quota_mode`: over the limit, the descriptor says so, but the
    /// request is refused only when every quota-mode descriptor is over.
    pub(super) quota_mode: bool,
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
    /// `scope`: `Some(true)` global, `Some(false)` local, `None` global
    /// when the service has a Redis backend, as envoyproxy/ratelimit counts.
    pub(super) global: Option<bool>,
    pub(super) failure_mode: Option<FailureMode>,
    pub(super) lease: Option<LeasePolicy>,
    pub(super) coalesce: Option<bool>,
}

impl RuleSpec {
    /// A spec for a rule that decides nothing.
    pub(super) fn placeholder() -> Self {
        Self {
            quota: Quota::per_second(1),
            shadow: true,
            algorithm: None,
            global: Some(false),
            failure_mode: None,
            lease: None,
            coalesce: None,
        }
    }
}

/// envoyproxy/ratelimit's units. A month is 30 days and a year 365, as
/// envoyproxy/ratelimit counts them, unless the extension `calendar: true`
/// makes a day or a month a calendar one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TimeUnit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl<'de> Deserialize<'de> for TimeUnit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        TimeUnit::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "invalid rate limit unit {name:?} (second, minute, hour, day, week, month or year)"
            ))
        })
    }
}

impl TimeUnit {
    /// A unit by name, in any case, as envoyproxy/ratelimit reads it.
    fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "second" => TimeUnit::Second,
            "minute" => TimeUnit::Minute,
            "hour" => TimeUnit::Hour,
            "day" => TimeUnit::Day,
            "week" => TimeUnit::Week,
            "month" => TimeUnit::Month,
            "year" => TimeUnit::Year,
            _ => return None,
        })
    }

    pub(super) fn length(self) -> Duration {
        Duration::from_secs(match self {
            TimeUnit::Second => 1,
            TimeUnit::Minute => 60,
            TimeUnit::Hour => 3_600,
            TimeUnit::Day => 86_400,
            TimeUnit::Week => 7 * 86_400,
            TimeUnit::Month => 30 * 86_400,
            TimeUnit::Year => 365 * 86_400,
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
    #[serde(default)]
    quota_mode: bool,
    #[serde(default)]
    share_threshold: bool,
    /// These three shape envoyproxy/ratelimit's statsd keys and its
    /// response metadata; read and checked, they change nothing here: each
    /// limit is counted per rule, its path (`rate_limit_decisions_total`).
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    #[allow(dead_code)]
    value_to_metric: bool,
    #[allow(dead_code)]
    metadata: Option<serde_norway::Mapping>,
    // This crate's extensions.
    algorithm: Option<Algorithm>,
    burst: Option<u32>,
    #[serde(default)]
    calendar: bool,
    scope: Option<RawScope>,
    failure_mode: Option<FailureMode>,
    lease: Option<LeasePolicy>,
    coalesce: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    /// Required, unless `unlimited`, where it is refused.
    unit: Option<TimeUnit>,
    #[serde(default)]
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
        let raw: RawDomain = serde_norway::from_str(src).map_err(|e| yaml_error(&e, src))?;
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
    pub fn merge(self, other: RlsConfig) -> Result<Self, ConfigError> {
        self.join(other, false)
    }

    /// Both configurations' domains, a domain both define holding the
    /// descriptors of both: envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`.
    ///
    /// # Errors
    ///
    /// A top-level descriptor (key and value) of one domain in both.
    pub fn merge_domains(self, other: RlsConfig) -> Result<Self, ConfigError> {
        self.join(other, true)
    }

    fn join(mut self, other: RlsConfig, domains: bool) -> Result<Self, ConfigError> {
        for (domain, nodes) in other.domains {
            let Some(ours) = self.domains.get_mut(&domain) else {
                self.domains.insert(domain, nodes);
                continue;
            };
            if !domains {
                return Err(ConfigError::new(format!(
                    "domain {domain:?} is defined twice"
                )));
            }
            for n in nodes {
                if ours.iter().any(|c| c.path == n.path) {
                    return Err(ConfigError::new(format!(
                        "descriptor {:?} is defined twice",
                        n.path
                    )));
                }
                ours.push(n);
            }
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
            push_once(&mut nodes, node(d, &raw.domain, src)?, src)?;
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

/// Where the descriptor of `key` (and `value`) first appears in `src`, as a
/// line and column: semantic errors point at their descriptor's `key`.
fn locate(src: &str, key: &str, value: Option<&str>) -> (usize, usize) {
    locate_in(src, key, value, false)
}

/// [`locate`]'s last match: where a duplicate is.
fn locate_last(src: &str, key: &str, value: Option<&str>) -> (usize, usize) {
    locate_in(src, key, value, true)
}

fn locate_in(src: &str, key: &str, value: Option<&str>, last: bool) -> (usize, usize) {
    let probe = format!("key: {key}");
    let mut best = None;
    let mut found: Vec<usize> = src.match_indices(&probe).map(|(at, _)| at).collect();
    if last {
        found.reverse();
    }
    for at in found {
        let after = &src[at..];
        let mut end = after.len().min(400);
        while !after.is_char_boundary(end) {
            end -= 1;
        }
        let window = &after[..end];
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

fn node(mut raw: RawDescriptor, parent: &str, src: &str) -> Result<Node, ConfigError> {
    let (line, column) = locate(src, &raw.key, raw.value.as_deref());
    let fail = |msg: String| ConfigError::at(msg, src, line, column);
    if raw.key.is_empty() {
        return Err(fail("descriptor `key` is empty".into()));
    }
    let (value, path) = match raw.value.take() {
        None => (Match::Any, format!("{parent}.{}", raw.key)),
        Some(v) => {
            let path = format!("{parent}.{}_{v}", raw.key);
            let m = if v.contains('*') {
                Match::Wildcard(v.split('*').map(str::to_owned).collect())
            } else {
                Match::Exact(v)
            };
            (m, path)
        }
    };
    if !path.bytes().all(|b| b.is_ascii_graphic()) || path.contains(['{', '}']) {
        return Err(fail(format!(
            "descriptor {path:?}: keys and values name the rule, so they are printable ASCII without spaces or braces"
        )));
    }
    if (raw.lease.is_some() || raw.coalesce.is_some()) && raw.scope == Some(RawScope::Local) {
        return Err(fail(format!(
            "descriptor {path:?}: `lease` and `coalesce` need a global scope, not `scope: local`"
        )));
    }
    let shared = match (&value, raw.share_threshold) {
        (Match::Wildcard(parts), true) => Some(parts.join("*")),
        (_, true) => {
            return Err(fail(format!(
                "descriptor {path:?}: `share_threshold` needs a wildcard value (with `*`)"
            )));
        }
        (_, false) => None,
    };
    let limit = match raw.rate_limit.take() {
        None => None,
        Some(l) => Some(limit(l, &raw, &path).map_err(fail)?),
    };
    let mut children: Vec<Node> = Vec::new();
    for d in std::mem::take(&mut raw.descriptors) {
        push_once(&mut children, node(d, &path, src)?, src)?;
    }
    Ok(Node {
        key: raw.key,
        value,
        shared,
        limit,
        children,
        path,
        rule: None,
    })
}

/// Adds `n` beside `nodes`, refusing a second descriptor of the same key
/// and value (envoyproxy/ratelimit's "duplicate descriptor composite key").
fn push_once(nodes: &mut Vec<Node>, n: Node, src: &str) -> Result<(), ConfigError> {
    if nodes.iter().any(|c| c.path == n.path) {
        let value = match &n.value {
            Match::Exact(v) => Some(v.as_str()),
            _ => None,
        };
        let (line, column) = locate_last(src, &n.key, value);
        return Err(ConfigError::at(
            format!("descriptor {:?} is defined twice", n.path),
            src,
            line,
            column,
        ));
    }
    nodes.push(n);
    Ok(())
}

/// A descriptor's `rate_limit`, checked as envoyproxy/ratelimit checks it.
fn limit(l: RawLimit, raw: &RawDescriptor, path: &str) -> Result<Limit, String> {
    let unit = match (l.unlimited, l.unit) {
        (true, Some(_)) => {
            return Err(format!(
                "descriptor {path:?}: an `unlimited` limit takes no `unit`"
            ));
        }
        // Shown as the second, the unit of a limit that never counts.
        (true, None) => TimeUnit::Second,
        (false, Some(u)) => u,
        (false, None) => {
            return Err(format!(
                "descriptor {path:?}: a `rate_limit` needs a `unit`"
            ));
        }
    };
    for r in &l.replaces {
        if r.name.is_empty() {
            return Err(format!("descriptor {path:?}: an empty `replaces` name"));
        }
        if l.name.as_deref() == Some(r.name.as_str()) {
            return Err(format!(
                "descriptor {path:?}: `replaces` names the limit itself ({:?})",
                r.name
            ));
        }
    }
    let kind = if l.unlimited {
        LimitKind::Unlimited
    } else if l.requests_per_unit == 0 {
        LimitKind::Blocked
    } else {
        let n = l.requests_per_unit;
        let quota = match (raw.calendar, unit) {
            (true, TimeUnit::Day) => Quota::per_calendar_day(n),
            (true, TimeUnit::Month) => Quota::per_calendar_month(n),
            (true, other) => {
                return Err(format!(
                    "`calendar: true` needs unit day or month, not {other:?}"
                ));
            }
            // As envoyproxy/ratelimit counts, unless an extension of this
            // crate's counting says otherwise: a fixed window on the clock.
            (false, unit)
                if raw.algorithm.is_none()
                    && raw.burst.is_none()
                    && raw.lease.is_none()
                    && raw.coalesce.is_none() =>
            {
                Quota::aligned(n, unit.length())
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
            global: raw.scope.as_ref().map(|s| *s == RawScope::Global),
            failure_mode: raw.failure_mode,
            lease: raw.lease,
            coalesce: raw.coalesce,
        })
    };
    Ok(Limit {
        kind,
        name: l.name,
        replaces: l.replaces.into_iter().map(|r| r.name).collect(),
        unit,
        requests_per_unit: l.requests_per_unit,
        quota_mode: raw.quota_mode,
    })
}

/// The nodes of a descriptor's entries, one per entry (a descriptor is
/// rarely deeper than four).
pub(super) type Matched<'a> = smallvec::SmallVec<[&'a Node; 4]>;

/// The nodes a descriptor's entries lead to, one per entry, matched by
/// depth as envoyproxy/ratelimit matches them: at each depth a `key` with
/// its exact `value` first, then the wildcards in the file's order, then
/// the `key` alone. Empty when an entry matches nothing.
pub(super) fn find<'a, 'e>(
    mut nodes: &'a [Node],
    entries: impl Iterator<Item = (&'e str, &'e str)>,
) -> Matched<'a> {
    let mut path = Matched::new();
    for (key, value) in entries {
        let same_key = || nodes.iter().filter(|n| n.key == *key);
        let exact = |n: &&Node| matches!(&n.value, Match::Exact(v) if v == value);
        let wild = |n: &&Node| matches!(&n.value, Match::Wildcard(_)) && n.value.matches(value);
        let Some(node) = same_key()
            .find(exact)
            .or_else(|| same_key().find(wild))
            .or_else(|| same_key().find(|n| n.value == Match::Any))
        else {
            return Matched::new();
        };
        path.push(node);
        nodes = &node.children;
    }
    path
}

/// Sets each node's `rule` to what `place` says of its path.
pub(super) fn place_rules(nodes: &mut [Node], place: &impl Fn(&str) -> Option<RuleIndex>) {
    for n in nodes {
        n.rule = place(&n.path);
        place_rules(&mut n.children, place);
    }
}

/// A YAML error at its line and column, as the library's own files report
/// theirs.
fn yaml_error(e: &serde_norway::Error, src: &str) -> ConfigError {
    let text = e.to_string();
    match e.location() {
        // The message names the place already; drop its " at line …".
        Some(at) => {
            let msg = text.rsplit_once(" at line ").map_or(&*text, |(m, _)| m);
            ConfigError::at(msg, src, at.line(), at.column())
        }
        None => ConfigError::new(text),
    }
}
