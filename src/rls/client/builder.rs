//! The remote layer's builder, and the decision it makes per request.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http::request::Parts;
use http::{HeaderName, HeaderValue};
use tonic::transport::{Channel, Endpoint};

use super::service::RemoteRateLimitLayer;
use crate::error::BuildError;
use crate::failure::{Admit, CircuitBreaker};
use crate::gate::Admission;
use crate::headers::Rendered;
use crate::key::KeyExtractor;
use crate::policy::{BreakerConfig, FailureMode};
use crate::response::{Denied, Refusals, problem_json, refusal};

/// Builds a [`RemoteRateLimitLayer`]; see the [module page](super).
#[derive(Debug)]
pub struct RemoteRateLimitBuilder {
    url: String,
    domain: String,
    descriptors: Vec<Vec<(String, KeyExtractor)>>,
    timeout: Duration,
    failure: FailureMode,
    breaker: BreakerConfig,
}

impl RemoteRateLimitBuilder {
    pub(super) fn new(url: String, domain: String) -> Self {
        Self {
            url,
            domain,
            descriptors: Vec::new(),
            timeout: Duration::from_millis(20),
            failure: FailureMode::FailOpen,
            breaker: BreakerConfig::default(),
        }
    }

    /// One descriptor: its entries' keys, each with the extractor of its value.
    pub fn descriptor<K: Into<String>>(
        mut self,
        entries: impl IntoIterator<Item = (K, KeyExtractor)>,
    ) -> Self {
        self.descriptors
            .push(entries.into_iter().map(|(k, e)| (k.into(), e)).collect());
        self
    }

    /// How long one call may take (default 20 ms, Envoy's filter's).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a request gets when the call fails or the breaker is open
    /// (default `FailOpen`, as Envoy's `failure_mode_deny: false`):
    /// `FailOpen` or `FailClosed`.
    pub fn on_failure(mut self, mode: FailureMode) -> Self {
        self.failure = mode;
        self
    }

    /// The circuit breaker around the calls (the rules' default).
    pub fn circuit_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = config;
        self
    }

    /// Checks the settings; connects on the first request.
    ///
    /// # Errors
    ///
    /// A URL tonic can't use, no descriptor, an empty domain or entry key,
    /// an extractor that awaits, a zero timeout, or a failure mode other
    /// than `FailOpen` and `FailClosed`.
    pub fn build(self) -> Result<RemoteRateLimitLayer, BuildError> {
        let invalid = BuildError::InvalidSetting;
        let endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|_| invalid("the rate-limit service's URL is not a URI"))?;
        if self.domain.is_empty() {
            return Err(invalid("the rate-limit domain is empty"));
        }
        if self.descriptors.is_empty() || self.descriptors.iter().any(Vec::is_empty) {
            return Err(invalid(
                "a remote rate limit needs descriptors with entries",
            ));
        }
        for (key, e) in self.descriptors.iter().flatten() {
            if key.is_empty() {
                return Err(invalid("a descriptor entry's key is empty"));
            }
            if !e.is_sync() {
                return Err(BuildError::InvalidKey {
                    rule: format!("descriptor entry {key:?}"),
                    error:
                        "its extractor awaits; a remote descriptor reads the request head at once"
                            .into(),
                });
            }
        }
        if self.timeout.is_zero() {
            return Err(invalid("the remote rate limit's timeout is zero"));
        }
        if !matches!(
            self.failure,
            FailureMode::FailOpen | FailureMode::FailClosed
        ) {
            return Err(invalid("a remote rate limit fails open or closed"));
        }
        Ok(RemoteRateLimitLayer {
            remote: Arc::new(Remote {
                domain: self.domain,
                descriptors: self.descriptors,
                endpoint,
                client: std::sync::OnceLock::new(),
                timeout: self.timeout,
                failure: self.failure,
                breaker: CircuitBreaker::new(self.breaker, self.timeout),
                refusals: Refusals {
                    body: Arc::new(problem_json),
                    grpc_message: None,
                },
            }),
        })
    }
}

/// What every service of one remote layer shares.
pub(super) struct Remote {
    domain: String,
    descriptors: Vec<Vec<(String, KeyExtractor)>>,
    endpoint: Endpoint,
    /// Made on the first request, on its runtime: a layer may be built
    /// before one runs.
    client: std::sync::OnceLock<RateLimitServiceClient<Channel>>,
    timeout: Duration,
    failure: FailureMode,
    breaker: CircuitBreaker,
    refusals: Refusals,
}

impl Remote {
    /// The descriptors this request sends; none when no extractor applies.
    pub(super) fn descriptors(&self, parts: &Parts) -> Vec<RateLimitDescriptor> {
        self.descriptors
            .iter()
            .filter_map(|entries| {
                let entries = entries
                    .iter()
                    .map(|(key, e)| {
                        let value = e.extract_now(parts)?;
                        Some(Entry {
                            key: key.clone(),
                            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                Some(RateLimitDescriptor {
                    entries,
                    ..RateLimitDescriptor::default()
                })
            })
            .collect()
    }

    /// Asks the service, and turns its answer (or its failure) into an
    /// admission.
    pub(super) async fn decide(
        self: Arc<Self>,
        parts: Parts,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> (Parts, Admission<()>) {
        if let Admit::Skip(wait) = self.breaker.admit() {
            let admission = self.failed(&parts, wait);
            return (parts, admission);
        }
        let request = RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: 0,
        };
        let mut client = self
            .client
            .get_or_init(|| RateLimitServiceClient::new(self.endpoint.connect_lazy()))
            .clone();
        let call = client.should_rate_limit(request);
        let answer = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(res)) => res.into_inner(),
            Ok(Err(status)) => {
                tracing::warn!(target: crate::observe::TARGET, code = ?status.code(), message = status.message(), "the rate-limit service failed");
                self.breaker.failure();
                let admission = self.failed(&parts, self.wait());
                return (parts, admission);
            }
            Err(_) => {
                tracing::warn!(target: crate::observe::TARGET, timeout_ms = self.timeout.as_millis() as u64, "the rate-limit service did not answer in time");
                self.breaker.failure();
                let admission = self.failed(&parts, self.wait());
                return (parts, admission);
            }
        };
        self.breaker.success();
        let mut headers = Rendered::new();
        let mut retry_after = None;
        for h in &answer.response_headers_to_add {
            if h.key.eq_ignore_ascii_case("retry-after") {
                retry_after = h.value.parse::<u64>().ok().map(Duration::from_secs);
                continue;
            }
            if h.key.eq_ignore_ascii_case("content-type") {
                continue;
            }
            if let (Ok(name), Ok(value)) = (
                HeaderName::try_from(h.key.as_str()),
                HeaderValue::try_from(h.value.as_str()),
            ) {
                headers.push((name, value));
            }
        }
        if answer.overall_code != Code::OverLimit as i32 {
            return (parts, Admission::Go(headers, ()));
        }
        let wait = retry_after.or_else(|| {
            answer
                .statuses
                .iter()
                .filter(|s| s.code == Code::OverLimit as i32)
                .filter_map(|s| s.duration_until_reset.as_ref())
                .map(|d| {
                    Duration::from_secs(d.seconds.max(0) as u64)
                        + Duration::from_nanos(d.nanos.max(0) as u64)
                })
                .max()
        });
        let denied = Denied::new(self.domain.as_str(), wait);
        let res = refusal(&self.refusals, &denied, &parts.headers, headers);
        (parts, Admission::Stop(res))
    }

    /// How long a refusal of a failed call asks to wait: the breaker's
    /// remaining open time, else a second.
    fn wait(&self) -> Duration {
        self.breaker
            .open_remaining()
            .unwrap_or(Duration::from_secs(1))
    }

    /// The failure mode's answer while the service cannot decide.
    fn failed(&self, parts: &Parts, wait: Duration) -> Admission<()> {
        match self.failure {
            FailureMode::FailClosed => {
                let denied = Denied::new(self.domain.as_str(), Some(wait));
                Admission::Stop(refusal(
                    &self.refusals,
                    &denied,
                    &parts.headers,
                    Rendered::new(),
                ))
            }
            _ => Admission::Go(Rendered::new(), ()),
        }
    }
}
