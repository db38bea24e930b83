//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over a
//! [`RateLimitLayer`] whose rules are the configuration's limits, one rule
//! each, decided through the engine's keyed door: no request is made up.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use crate::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use crate::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::config::ConfigError;
use keyed_rate_limit::decision::{Decision, RuleDecision, Source};
use keyed_rate_limit::rate_limit::{KeyedAsk, KeyedRules, RateLimitLayer, RuleIndex};
use keyed_rate_limit::{KeyExtractor, OnMissingKey, Quota, Rule};

use super::config::{Limit, LimitKind, Node, RlsConfig, RuleSpec, find, place_rules};
use super::status::{bare, counter_key, current, of, pb_headers, unit_of};

/// The rate-limit service: Envoy's RLS v3 over this crate's rules and
/// counters. Cheap to clone; see the [module page](super).
#[derive(Clone)]
pub struct RateLimitServer {
    inner: Arc<Inner>,
}

struct Inner {
    layer: RateLimitLayer,
    /// Swapped whole by a reload; each request reads it once.
    snapshot: RwLock<Arc<Snapshot>>,
    /// One reload at a time.
    reloading: Mutex<()>,
    settings: Settings,
}

/// What the builder adds to every limit, at start and at each reload.
#[derive(Debug, Default, Clone)]
struct Settings {
    redis: Option<RedisBackend>,
    shadow: bool,
    near_limit: Option<f64>,
}

/// What one request is decided with: the domains and their rules, from
/// one configuration.
struct Snapshot {
    domains: BTreeMap<String, Vec<Node>>,
    rules: KeyedRules,
    /// Every limit in shadow mode.
    shadow: bool,
}

impl std::fmt::Debug for RateLimitServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitServer")
            .field(
                "domains",
                &self.snapshot().domains.keys().collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A limit's rule: its key is handed over by the keyed door, never read
/// from a request, so its extractor finds none (a layer made of these
/// rules in front of a service limits nothing).
fn rule_for(name: &str, spec: &RuleSpec) -> Rule {
    let key = KeyExtractor::new("descriptor", |_| None);
    let mut rule = Rule::new(name.to_owned(), key, spec.quota)
        .on_missing_key(OnMissingKey::Skip)
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
    settings: Settings,
}

impl RateLimitServerBuilder {
    /// The backend of every `scope: global` limit.
    pub fn redis(mut self, backend: RedisBackend) -> Self {
        self.settings.redis = Some(backend);
        self
    }

    /// Every limit in shadow mode: counted, logged and measured, never
    /// refusing (envoyproxy/ratelimit's `SHADOW_MODE`).
    pub fn shadow(mut self, on: bool) -> Self {
        self.settings.shadow = on;
        self
    }

    /// Every limit's near-limit ratio, as [`Rule::near_limit_ratio`]: the
    /// share of its limit left (default 0.2, which is what
    /// envoyproxy/ratelimit's `NEAR_LIMIT_RATIO` of 0.8, a share used,
    /// means).
    pub fn near_limit_ratio(mut self, ratio: f64) -> Self {
        self.settings.near_limit = Some(ratio);
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
        let rules = rules_of(&self.settings, &self.config)?;
        // Nothing to give back: every rule is decided on its own.
        let layer = RateLimitLayer::builder()
            .refunds(false)
            .rules(rules)
            .build()
            .map_err(ConfigError::from)?;
        let snapshot = Snapshot::new(self.config.domains, layer.keyed(), self.settings.shadow);
        Ok(RateLimitServer {
            inner: Arc::new(Inner {
                layer,
                snapshot: RwLock::new(Arc::new(snapshot)),
                reloading: Mutex::new(()),
                settings: self.settings,
            }),
        })
    }
}

impl Snapshot {
    /// The domains with each limit's node pointing at its rule in `chain`.
    fn new(mut domains: BTreeMap<String, Vec<Node>>, rules: KeyedRules, shadow: bool) -> Self {
        for nodes in domains.values_mut() {
            place_rules(nodes, &|path| rules.rule(path));
        }
        Self {
            domains,
            rules,
            shadow,
        }
    }
}

/// One rule per limit, named by its path.
fn rules_of(settings: &Settings, config: &RlsConfig) -> Result<Vec<Rule>, ConfigError> {
    let redis = settings.redis.as_ref();
    let mut rules = Vec::new();
    let mut limits = Vec::new();
    for nodes in config.domains.values() {
        each_limit(nodes, &mut limits);
    }
    let mut apart = 0;
    for (node, spec) in limits {
        let mut rule = rule_for(&node.path, spec);
        if settings.shadow {
            rule = rule.shadow(true);
        }
        if let Some(r) = settings.near_limit {
            rule = rule.near_limit_ratio(Some(r));
        }
        // As envoyproxy/ratelimit counts: in Redis when there is one, and
        // what only Redis can do (leases, group commit) asks for it.
        let global = spec
            .global
            .unwrap_or(redis.is_some() || spec.lease.is_some() || spec.coalesce.is_some());
        apart += usize::from(spec.global.is_none() && !global);
        if global {
            let Some(redis) = redis else {
                return Err(ConfigError::new(format!(
                    "descriptor {:?}: a global scope (`scope: global`, a lease, coalescing) needs a Redis backend (RateLimitServerBuilder::redis)",
                    node.path
                )));
            };
            rule = rule.global(redis.clone());
            if let Some(mode) = spec.failure_mode {
                rule = rule.on_redis_failure(mode);
            }
            if let Some(lease) = spec.lease {
                rule = rule.lease(lease);
            }
            if let Some(on) = spec.coalesce {
                rule = rule.coalesce(on);
            }
        }
        rules.push(rule);
    }
    if apart > 0 {
        tracing::warn!(
            limits = apart,
            "the rate-limit service has no Redis backend: each instance counts its limits alone"
        );
    }
    if rules.is_empty() {
        // A layer holds one rule at least; no descriptor reaches this one
        // (every path has a dot), so a configuration without limits
        // answers every descriptor OK, as envoyproxy/ratelimit does.
        rules.push(rule_for("no limits", &RuleSpec::placeholder()));
    }
    Ok(rules)
}

impl RateLimitServer {
    /// A builder for `config`.
    pub fn builder(config: RlsConfig) -> RateLimitServerBuilder {
        RateLimitServerBuilder {
            config,
            settings: Settings::default(),
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
    /// reload does). Each request is decided wholly by the configuration
    /// before or wholly by this one.
    ///
    /// # Errors
    ///
    /// As [`RateLimitServerBuilder::build`]; the running configuration stays.
    pub fn reload(&self, config: RlsConfig) -> Result<(), ConfigError> {
        let rules = rules_of(&self.inner.settings, &config)?;
        let _one = self
            .inner
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.inner.layer.reload(rules).map_err(ConfigError::from)?;
        let snapshot = Snapshot::new(
            config.domains,
            self.inner.layer.keyed(),
            self.inner.settings.shadow,
        );
        *self
            .inner
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
        Ok(())
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.inner
            .snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Decides a whole request, as `ShouldRateLimit` answers it: every
    /// descriptor on one snapshot, all of them together.
    async fn answer(&self, req: RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            return Err(Status::invalid_argument("the request's `domain` is empty"));
        }
        let snap = self.snapshot();
        let nodes = snap.domains.get(&req.domain).map_or(&[][..], Vec::as_slice);
        let found = |i: usize, d: &RateLimitDescriptor| {
            if d.entries.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i} has no entries"
                )));
            }
            Ok(find(
                nodes,
                d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
            ))
        };
        // Most requests carry one descriptor: decided without collecting.
        if let [d] = req.descriptors.as_slice() {
            let path = found(0, d)?;
            // A limit cannot replace itself (refused at load).
            let answer = match plan(&snap, &req, d, limit_of(&path, &[]))? {
                Plan::Status(status) => Answer::Status(status),
                Plan::Peek {
                    ask,
                    shown,
                    shadow,
                    path,
                } => {
                    // Boxed, as below: rare, and not in every request's future.
                    let peek = Box::pin(snap.rules.peek(ask.rule, &ask.key, ask.quota));
                    let peeked = peek.await;
                    peeked_answer(&snap, ask.rule, shown, shadow, path, peeked)?
                }
                Plan::Decide { ask, shown, path } => {
                    let decided = snap
                        .rules
                        .decide(ask.rule, ask.key, ask.cost, ask.quota)
                        .await;
                    decided_answer(shown, path, decided)?
                }
            };
            return Ok(respond(&snap, [(answer, quota_mode(&path))]));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument("the request has no descriptors"));
        }
        let matched = (req.descriptors.iter().enumerate())
            .map(|(i, d)| found(i, d))
            .collect::<Result<Vec<_>, _>>()?;
        // `replaces`: a limit a matched limit replaces does not apply (a
        // few names at most, most often none: no set to build).
        let replaced: Vec<&str> = matched
            .iter()
            .filter_map(|p| p.last())
            .filter_map(|n| n.limit.as_ref())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let plans = req
            .descriptors
            .iter()
            .zip(&matched)
            .map(|(d, path)| plan(&snap, &req, d, limit_of(path, &replaced)))
            .collect::<Result<Vec<_>, _>>()?;
        // Boxed: the one-descriptor path above would otherwise carry (and
        // copy) this path's larger future.
        let answers = Box::pin(together(&snap, plans)).await;
        let answers = answers
            .into_iter()
            .zip(&matched)
            .map(|(a, p)| Ok((a?, quota_mode(p))));
        Ok(respond(&snap, answers.collect::<Result<Vec<_>, Status>>()?))
    }
}

/// The limit `path` ends on, unless a name in `replaced` replaces it.
fn limit_of<'a>(path: &'a [&'a Node], replaced: &[&str]) -> Option<(&'a [&'a Node], &'a Limit)> {
    let limit = path.last()?.limit.as_ref()?;
    let name = limit.name.as_deref();
    name.is_none_or(|n| !replaced.contains(&n))
        .then_some((path, limit))
}

/// Whether the limit `path` ends on takes part in `quota_mode`.
fn quota_mode(path: &[&Node]) -> bool {
    (path.last().and_then(|n| n.limit.as_ref())).is_some_and(|l| l.quota_mode)
}

/// The response to the descriptors' answers, in their order, each with
/// whether its limit is in `quota_mode`.
fn respond(
    snap: &Snapshot,
    answers: impl IntoIterator<Item = (Answer, bool)>,
) -> RateLimitResponse {
    let mut response = RateLimitResponse::default();
    let mut decided = Vec::new();
    // `quota_mode`: those over refuse only when all of them are.
    let (mut quotas, mut quotas_over, mut over) = (0, 0, false);
    for (answer, quota_mode) in answers {
        let status = match answer {
            Answer::Status(status) => status,
            Answer::Decided(d, shown) => {
                let status = match d.source {
                    // The request goes on without a counter's say, and
                    // without made-up numbers.
                    Source::FailOpen => bare(Code::Ok),
                    _ => of(d.decision, shown, d.shadow),
                };
                decided.push(d);
                status
            }
        };
        let refused = status.code == Code::OverLimit as i32;
        if quota_mode {
            quotas += 1;
            quotas_over += usize::from(refused);
        } else {
            over |= refused;
        }
        response.statuses.push(status);
    }
    over |= quotas > 0 && quotas == quotas_over;
    response.overall_code = if over { Code::OverLimit } else { Code::Ok } as i32;
    let answer = snap.rules.answer(decided);
    match answer.refusal {
        Some(res) => {
            let (parts, body) = res.into_parts();
            response.response_headers_to_add = pb_headers(parts.headers.iter());
            response.raw_body = body.to_vec();
        }
        None => {
            response.response_headers_to_add =
                pb_headers(answer.headers.iter().map(|(k, v)| (k, v)));
        }
    }
    response
}

/// One descriptor's answer: a status no rule decided, or a rule's
/// decision with the limit its status shows.
enum Answer {
    Status(DescriptorStatus),
    Decided(RuleDecision, RateLimit),
}

/// What one descriptor needs: a status no rule decides, a check of its
/// rule without counting, or its rule's decision.
enum Plan<'a> {
    Status(DescriptorStatus),
    Peek {
        ask: KeyedAsk,
        shown: RateLimit,
        shadow: bool,
        path: &'a str,
    },
    Decide {
        ask: KeyedAsk,
        shown: RateLimit,
        path: &'a str,
    },
}

/// What one descriptor of `req` needs on `snap`: the limit it matched, if
/// any.
fn plan<'a>(
    snap: &Snapshot,
    req: &RateLimitRequest,
    d: &RateLimitDescriptor,
    limit: Option<(&[&'a Node], &Limit)>,
) -> Result<Plan<'a>, Status> {
    let Some((path, limit)) = limit else {
        return Ok(Plan::Status(bare(Code::Ok)));
    };
    let node = path[path.len() - 1];
    match &limit.kind {
        // As envoyproxy/ratelimit answers it: all of a never-ending quota left.
        LimitKind::Unlimited => {
            return Ok(Plan::Status(DescriptorStatus {
                limit_remaining: u32::MAX,
                ..bare(Code::Ok)
            }));
        }
        LimitKind::Blocked => {
            return Ok(Plan::Status(DescriptorStatus {
                current_limit: Some(current(limit)),
                ..bare(Code::OverLimit)
            }));
        }
        LimitKind::Rule(_) => {}
    }
    let Some(rule) = node.rule else {
        return Err(Status::internal(format!(
            "limit {:?} has no rule",
            node.path
        )));
    };
    // A descriptor's own `limit` replaces the quota, counted apart.
    let (quota, shown) = match &d.limit {
        Some(o) => {
            let shown = RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
            };
            if o.requests_per_unit == 0 {
                return Ok(Plan::Status(DescriptorStatus {
                    current_limit: Some(shown),
                    ..bare(Code::OverLimit)
                }));
            }
            let length = unit_of(o.unit).length();
            // In the limit's own way of counting.
            let q = match &limit.kind {
                LimitKind::Rule(spec) if spec.algorithm.is_some() => {
                    Quota::new(o.requests_per_unit, length)
                }
                _ => Quota::aligned(o.requests_per_unit, length),
            };
            (Some(q), shown)
        }
        None => (None, current(limit)),
    };
    let key = counter_key(&d.entries, path);
    let hits = match d.hits_addend {
        Some(h) => h,
        None if req.hits_addend == 0 => 1,
        None => u64::from(req.hits_addend),
    };
    let path = node.path.as_str();
    let shadow = snap.shadow || matches!(&limit.kind, LimitKind::Rule(s) if s.shadow);
    let cost = NonZeroU32::new(u32::try_from(hits).unwrap_or(u32::MAX));
    let ask = |cost| KeyedAsk {
        rule,
        key,
        cost,
        quota,
    };
    Ok(match cost {
        // Checked, not counted.
        None => Plan::Peek {
            ask: ask(NonZeroU32::MIN),
            shown,
            shadow,
            path,
        },
        Some(cost) => Plan::Decide {
            ask: ask(cost),
            shown,
            path,
        },
    })
}

/// The plans carried out together: the checks beside the decisions, and
/// the decisions at once (a request's global limits on one Redis in one
/// call).
async fn together(snap: &Snapshot, plans: Vec<Plan<'_>>) -> Vec<Result<Answer, Status>> {
    /// What is left of a plan once its ask is sent.
    enum Slot<'a> {
        Status(DescriptorStatus),
        Peeked(RuleIndex, RateLimit, bool, &'a str),
        Decided(RateLimit, &'a str),
    }
    let (mut checks, mut asks) = (Vec::new(), Vec::new());
    let slots: Vec<Slot<'_>> = plans
        .into_iter()
        .map(|p| match p {
            Plan::Status(status) => Slot::Status(status),
            Plan::Peek {
                ask,
                shown,
                shadow,
                path,
            } => {
                let rule = ask.rule;
                checks.push(ask);
                Slot::Peeked(rule, shown, shadow, path)
            }
            Plan::Decide { ask, shown, path } => {
                asks.push(ask);
                Slot::Decided(shown, path)
            }
        })
        .collect();
    let peeks = checks
        .iter()
        .map(|a| snap.rules.peek(a.rule, &a.key, a.quota));
    let (decided, peeked) = futures_util::future::join(
        snap.rules.decide_all(asks),
        futures_util::future::join_all(peeks),
    )
    .await;
    let (mut decided, mut peeked) = (decided.into_iter(), peeked.into_iter());
    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Status(status) => Ok(Answer::Status(status)),
            Slot::Peeked(rule, shown, shadow, path) => {
                peeked_answer(snap, rule, shown, shadow, path, peeked.next().flatten())
            }
            Slot::Decided(shown, path) => decided_answer(shown, path, decided.next().flatten()),
        })
        .collect()
}

/// A check's answer. A store that cannot answer is the limit's failure
/// mode's: no check through a closed one.
fn peeked_answer(
    snap: &Snapshot,
    rule: RuleIndex,
    shown: RateLimit,
    shadow: bool,
    path: &str,
    peeked: Option<Decision>,
) -> Result<Answer, Status> {
    match peeked {
        Some(decision) => Ok(Answer::Status(of(decision, shown, shadow))),
        None if snap.rules.fails_closed(rule) => Err(unreachable(path)),
        None => Ok(Answer::Status(bare(Code::Ok))),
    }
}

/// A decision's answer.
fn decided_answer(
    shown: RateLimit,
    path: &str,
    decided: Option<RuleDecision>,
) -> Result<Answer, Status> {
    match decided {
        None => Err(Status::internal(format!("limit {path:?} has no rule"))),
        // The store cannot answer and the rule fails closed: Envoy's own
        // `failure_mode_deny` decides, as for a service that is down.
        Some(d) if d.source == Source::FailClosed => Err(unreachable(path)),
        Some(d) => Ok(Answer::Decided(d, shown)),
    }
}

fn unreachable(path: &str) -> Status {
    Status::unavailable(format!("rate limit {path:?} cannot reach its store"))
}

#[tonic::async_trait]
impl RateLimitService for RateLimitServer {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.answer(request.into_inner()).await.map(Response::new)
    }
}
