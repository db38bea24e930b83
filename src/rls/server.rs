//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a
//! [`RateLimitLayer`] whose rules are the configuration's limits.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue as PbHeader;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::{Request, Response, Status};

use super::config::{Limit, LimitKind, Node, RlsConfig, RuleSpec, Unit, find};
use crate::config::ConfigError;
use crate::decision::{Decision, Source};
use crate::key::{Key, KeyExtractor, OnMissingKey};
use crate::quota::Quota;
use crate::rate_limit::RateLimitLayer;
use crate::rule::Rule;

/// The rate-limit service: Envoy's RLS v3 over this crate's rules and
/// counters. Cheap to clone; see the [module page](super).
#[derive(Clone)]
pub struct RateLimitServer {
    inner: Arc<Inner>,
}

struct Inner {
    layer: RateLimitLayer,
    domains: RwLock<Arc<BTreeMap<String, Vec<Node>>>>,
    #[cfg(feature = "redis")]
    redis: Option<crate::backend::redis::RedisBackend>,
}

impl std::fmt::Debug for RateLimitServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitServer")
            .field("domains", &self.domains().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// What one descriptor asks of its rule, handed to the rule's key
/// extractor, cost and quota through the request's extensions.
#[derive(Clone)]
struct Target {
    rule: Arc<str>,
    key: Key,
    hits: u32,
    limit: Option<Quota>,
}

/// The name of a limit's rule for overridden quotas (`limit` in a descriptor).
fn override_name(path: &str) -> String {
    format!("{path}#limit")
}

fn rule_for(name: &str, spec: &RuleSpec, computed: bool) -> Rule {
    let own: Arc<str> = name.into();
    let key = KeyExtractor::new("descriptor", move |parts| {
        let t = parts.extensions.get::<Target>()?;
        (t.rule == own).then(|| t.key.clone())
    });
    let mut rule = if computed {
        let fallback = spec.quota;
        Rule::computed(name.to_owned(), key, move |parts| {
            parts
                .extensions
                .get::<Target>()
                .and_then(|t| t.limit)
                .unwrap_or(fallback)
        })
    } else {
        Rule::new(name.to_owned(), key, spec.quota)
    };
    rule = rule
        .on_missing_key(OnMissingKey::Skip)
        .cost_fn(|parts| parts.extensions.get::<Target>().map_or(1, |t| t.hits))
        .shadow(spec.shadow);
    if let Some(a) = spec.algorithm {
        rule = rule.algorithm(a);
    }
    rule
}

fn each_limit<'a>(nodes: &'a [Node], out: &mut Vec<(&'a Node, &'a RuleSpec)>) {
    for n in nodes {
        if let Some(Limit {
            kind: LimitKind::Rule(spec),
            ..
        }) = &n.limit
        {
            out.push((n, spec));
        }
        each_limit(&n.children, out);
    }
}

/// Builds what serves a configuration: an optional Redis backend for
/// `scope: global` limits, then [`build`](Self::build).
#[derive(Debug, Default)]
pub struct RateLimitServerBuilder {
    config: RlsConfig,
    #[cfg(feature = "redis")]
    redis: Option<crate::backend::redis::RedisBackend>,
}

impl RateLimitServerBuilder {
    /// The backend of every `scope: global` limit.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, backend: crate::backend::redis::RedisBackend) -> Self {
        self.redis = Some(backend);
        self
    }

    /// Checks and compiles the configuration's limits into rules.
    ///
    /// # Errors
    ///
    /// A limit the crate refuses (a zero window, a burst of 0, an algorithm
    /// its scope can't run), or a global limit without a Redis backend,
    /// naming the descriptor.
    pub fn build(self) -> Result<RateLimitServer, ConfigError> {
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rules(rules_of(&self, &self.config)?)
            .build()
            .map_err(ConfigError::from)?;
        Ok(RateLimitServer {
            inner: Arc::new(Inner {
                layer,
                domains: RwLock::new(Arc::new(self.config.domains)),
                #[cfg(feature = "redis")]
                redis: self.redis,
            }),
        })
    }
}

/// Two rules per limit: its own quota, and the quota a descriptor's
/// `limit` overrides it with (counted apart, as each distinct quota is).
fn rules_of(
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))] b: &RateLimitServerBuilder,
    config: &RlsConfig,
) -> Result<Vec<Rule>, ConfigError> {
    #[cfg(feature = "redis")]
    let redis = &b.redis;
    let mut rules = Vec::new();
    let mut limits = Vec::new();
    for nodes in config.domains.values() {
        each_limit(nodes, &mut limits);
    }
    for (node, spec) in limits {
        for (name, computed) in [
            (node.path.clone(), false),
            (override_name(&node.path), true),
        ] {
            #[cfg_attr(not(feature = "redis"), allow(unused_mut))]
            let mut rule = rule_for(&name, spec, computed);
            if spec.global {
                #[cfg(feature = "redis")]
                {
                    let Some(redis) = redis else {
                        return Err(ConfigError::new(format!(
                            "descriptor {:?}: `scope: global` needs a Redis backend (RateLimitServerBuilder::redis)",
                            node.path
                        )));
                    };
                    rule = rule.global(redis.clone());
                    if let Some(mode) = spec.failure_mode {
                        rule = rule.on_redis_failure(mode);
                    }
                    if let Some(lease) = spec.lease {
                        rule = rule.lease(lease.policy());
                    }
                    if let Some(on) = spec.coalesce {
                        rule = rule.coalesce(on);
                    }
                }
                #[cfg(not(feature = "redis"))]
                return Err(ConfigError::new(format!(
                    "descriptor {:?}: `scope: global` needs the `redis` feature",
                    node.path
                )));
            }
            rules.push(rule);
        }
    }
    Ok(rules)
}

impl RateLimitServer {
    /// A builder for `config`.
    pub fn builder(config: RlsConfig) -> RateLimitServerBuilder {
        RateLimitServerBuilder {
            config,
            #[cfg(feature = "redis")]
            redis: None,
        }
    }

    /// The tonic service to add to a `tonic::transport::Server`.
    pub fn into_service(self) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(self)
    }

    /// The layer whose rules the service runs: its `describe()`, control
    /// handle, snapshots and metrics are the service's.
    pub fn layer(&self) -> &RateLimitLayer {
        &self.inner.layer
    }

    /// Swaps in a new configuration; usage is kept for every limit whose
    /// rule stays (and converted when its quota changes, as a layer's
    /// reload does).
    ///
    /// # Errors
    ///
    /// As [`RateLimitServerBuilder::build`]; the running configuration stays.
    pub fn reload(&self, config: RlsConfig) -> Result<(), ConfigError> {
        let b = RateLimitServerBuilder {
            config: RlsConfig::default(),
            #[cfg(feature = "redis")]
            redis: self.inner.redis.clone(),
        };
        let rules = rules_of(&b, &config)?;
        self.inner.layer.reload(rules).map_err(ConfigError::from)?;
        *self
            .inner
            .domains
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(config.domains);
        Ok(())
    }

    fn domains(&self) -> Arc<BTreeMap<String, Vec<Node>>> {
        self.inner
            .domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Decides a whole request, as `ShouldRateLimit` answers it.
    async fn decide(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("the request's `domain` is empty"));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument("the request has no descriptors"));
        }
        let domains = self.domains();
        let nodes = domains.get(&req.domain).map_or(&[][..], Vec::as_slice);
        let mut matched = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i} has no entries"
                )));
            }
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            matched.push(find(nodes, &entries).and_then(|n| n.limit.as_ref()));
        }
        // `replaces`: a limit a matched limit replaces does not apply.
        let replaced: HashSet<&str> = matched
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let mut response = RateLimitResponse::default();
        let mut headers = Headers::default();
        let mut over = false;
        for (d, limit) in req.descriptors.iter().zip(&matched) {
            let limit = limit.filter(|l| l.name.as_deref().is_none_or(|n| !replaced.contains(n)));
            let status = match limit {
                None => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..DescriptorStatus::default()
                },
                Some(limit) => {
                    self.status(&req, d, limit, &mut headers, &mut response)
                        .await?
                }
            };
            over |= status.code == Code::OverLimit as i32;
            response.statuses.push(status);
        }
        response.overall_code = if over { Code::OverLimit } else { Code::Ok } as i32;
        response.response_headers_to_add = headers.into_pb();
        Ok(response)
    }

    /// One descriptor's status; a refusal's headers and body go to the response.
    async fn status(
        &self,
        req: &RateLimitRequest,
        d: &RateLimitDescriptor,
        limit: &Limit,
        headers: &mut Headers,
        response: &mut RateLimitResponse,
    ) -> Result<DescriptorStatus, Status> {
        let path = match &limit.kind {
            LimitKind::Unlimited => {
                return Ok(DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: Some(current(limit)),
                    ..DescriptorStatus::default()
                });
            }
            LimitKind::Blocked => {
                return Ok(DescriptorStatus {
                    code: Code::OverLimit as i32,
                    current_limit: Some(current(limit)),
                    ..DescriptorStatus::default()
                });
            }
            LimitKind::Rule(_) => self.rule_path(req, d)?,
        };
        let override_quota = d.limit.as_ref().map(|o| {
            let unit = unit_of(o.unit);
            (Quota::new(o.requests_per_unit.max(1), unit.length()), o)
        });
        let rule: Arc<str> = match &override_quota {
            Some(_) => override_name(&path).into(),
            None => path.into(),
        };
        let key = counter_key(&d.entries);
        let hits = match &d.hits_addend {
            Some(h) => h.value,
            None if req.hits_addend == 0 => 1,
            None => u64::from(req.hits_addend),
        };
        let shown = match &override_quota {
            Some((_, o)) => RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
            },
            None => current(limit),
        };
        if hits == 0 {
            // Checked, not counted.
            let decision = self
                .inner
                .layer
                .control()
                .peek(&rule, key)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            return Ok(of(decision, shown, false));
        }
        if override_quota
            .as_ref()
            .is_some_and(|(_, o)| o.requests_per_unit == 0)
        {
            return Ok(DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(shown),
                ..DescriptorStatus::default()
            });
        }
        let target = Target {
            rule: rule.clone(),
            key,
            hits: u32::try_from(hits).unwrap_or(u32::MAX),
            limit: override_quota.map(|(q, _)| q),
        };
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.extensions.insert(target);
        let detached = self.inner.layer.decide_detached(parts).await;
        let Some(decided) = detached.rules.iter().find(|r| r.rule == rule) else {
            return Err(Status::internal(format!("rule {rule:?} did not decide")));
        };
        if decided.source == Source::FailClosed {
            // The store cannot answer and the rule fails closed: Envoy's own
            // `failure_mode_deny` decides, as for a service that is down.
            return Err(Status::unavailable(format!(
                "rate limit {rule:?} cannot reach its store"
            )));
        }
        match detached.refusal {
            Some(res) => {
                let (parts, body) = res.into_parts();
                headers.add(parts.headers.iter());
                if response.raw_body.is_empty() {
                    response.raw_body = body.to_vec();
                }
            }
            None => headers.add(detached.headers.iter().map(|(k, v)| (k, v))),
        }
        Ok(of(decided.decision, shown, decided.shadow))
    }

    /// The rule path of the limit a descriptor matched, found again.
    fn rule_path(&self, req: &RateLimitRequest, d: &RateLimitDescriptor) -> Result<String, Status> {
        let domains = self.domains();
        let nodes = domains.get(&req.domain).map_or(&[][..], Vec::as_slice);
        let entries: Vec<(&str, &str)> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        find(nodes, &entries)
            .map(|n| n.path.clone())
            .ok_or_else(|| Status::unavailable("the configuration changed during the request"))
    }
}

fn unit_of(pb: i32) -> Unit {
    match pb {
        1 => Unit::Second,
        2 => Unit::Minute,
        3 => Unit::Hour,
        4 => Unit::Day,
        5 => Unit::Month,
        6 => Unit::Year,
        7 => Unit::Week,
        _ => Unit::Second,
    }
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn current(limit: &Limit) -> RateLimit {
    RateLimit {
        name: limit.name.clone().unwrap_or_default(),
        requests_per_unit: limit.requests_per_unit,
        unit: pb_unit(limit.unit) as i32,
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// A decision as a descriptor status; a shadow rule's refusal is `OK`.
fn of(decision: Decision, shown: RateLimit, shadow: bool) -> DescriptorStatus {
    let over = !decision.is_allowed() && !shadow;
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(shown),
        limit_remaining: decision.remaining(),
        duration_until_reset: Some(pb_duration(decision.reset())),
        ..DescriptorStatus::default()
    }
}

/// The response's headers: one line per name, list members joined as the
/// draft's structured fields join them; a refusal's `Retry-After` is the
/// longest wait.
#[derive(Default)]
struct Headers(Vec<(String, String)>);

impl Headers {
    fn add<'a>(&mut self, it: impl Iterator<Item = (&'a http::HeaderName, &'a http::HeaderValue)>) {
        for (name, value) in it {
            let Ok(value) = value.to_str() else { continue };
            match self.0.iter_mut().find(|(n, _)| n == name.as_str()) {
                Some((_, have)) if name == http::header::RETRY_AFTER => {
                    if value.parse::<u64>().ok() > have.parse::<u64>().ok() {
                        *have = value.to_owned();
                    }
                }
                Some((n, have)) if n.starts_with("ratelimit") => {
                    have.push_str(", ");
                    have.push_str(value);
                }
                Some(_) => {}
                None => self.0.push((name.as_str().to_owned(), value.to_owned())),
            }
        }
    }

    fn into_pb(self) -> Vec<PbHeader> {
        self.0
            .into_iter()
            .map(|(key, value)| PbHeader {
                key,
                value,
                ..PbHeader::default()
            })
            .collect()
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.into_inner()).await.map(Response::new)
    }
}

/// A descriptor's counter key: each entry's key and value, each after its
/// length, so that no two descriptors share one (`a` = `x|b=y` is not `a`
/// = `x`, `b` = `y`). Whatever a client sends is counted: the layer hashes
/// a key past its `max_key_len` to a fixed size.
fn counter_key(entries: &[Entry]) -> Key {
    use std::fmt::Write as _;
    let len: usize = entries
        .iter()
        .map(|e| e.key.len() + e.value.len() + 8)
        .sum();
    let mut out = String::with_capacity(len);
    for e in entries {
        let _ = write!(
            out,
            "{}:{}{}:{}",
            e.key.len(),
            e.key,
            e.value.len(),
            e.value
        );
    }
    Key::from(out)
}
