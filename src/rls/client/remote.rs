//! The decision a remote layer makes per request: descriptors from the
//! request head, one call, and its answer or its failure as an admission.

use std::sync::Arc;
use std::time::Duration;

use crate::rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::rls::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::rls::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http::request::Parts;
use http::{HeaderName, HeaderValue};
use tonic::transport::{Channel, Endpoint};

use crate::failure::{Admit, ReportedBreaker};
use crate::gate::Admission;
use crate::headers::Rendered;
use crate::key::KeyExtractor;
use crate::response::{Denied, Refusals, refusal};

/// What every service of one remote layer shares.
pub(super) struct Remote {
    pub(super) domain: String,
    pub(super) descriptors: Vec<Vec<(String, KeyExtractor)>>,
    pub(super) endpoint: Endpoint,
    /// Made on the first request, on its runtime: a layer may be built
    /// before one runs.
    pub(super) client: std::sync::OnceLock<RateLimitServiceClient<Channel>>,
    pub(super) timeout: Duration,
    /// Envoy's `failure_mode_deny`.
    pub(super) deny_on_failure: bool,
    pub(super) breaker: ReportedBreaker,
    pub(super) refusals: Refusals,
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
    pub(super) async fn ask(
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
                self.breaker
                    .failure(&format_args!("{:?}: {}", status.code(), status.message()));
                let admission = self.failed(&parts, self.wait());
                return (parts, admission);
            }
            Err(_) => {
                let timeout_ms = self.timeout.as_millis() as u64;
                tracing::warn!(target: crate::observe::TARGET, timeout_ms, "the rate-limit service did not answer in time");
                self.breaker
                    .failure(&format_args!("no answer in {timeout_ms} ms"));
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
        if !self.deny_on_failure {
            return Admission::Go(Rendered::new(), ());
        }
        let denied = Denied::new(self.domain.as_str(), Some(wait));
        Admission::Stop(refusal(
            &self.refusals,
            &denied,
            &parts.headers,
            Rendered::new(),
        ))
    }
}
