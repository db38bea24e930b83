//! The remote layer's builder.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Endpoint;

use super::remote::Remote;
use super::service::RemoteRateLimitLayer;
use crate::error::BuildError;
use crate::failure::ReportedBreaker;
use crate::key::KeyExtractor;
use crate::observe::Guarded;
use crate::policy::BreakerConfig;
use crate::response::{Refusals, problem_json};

impl RemoteRateLimitLayer {
    /// A builder for the service at `url` (`http://host:port`), asking
    /// about `domain`.
    pub fn builder(url: impl Into<String>, domain: impl Into<String>) -> RemoteRateLimitBuilder {
        RemoteRateLimitBuilder::new(url.into(), domain.into())
    }
}

/// Builds a [`RemoteRateLimitLayer`]; see the [module page](super).
#[derive(Debug)]
pub struct RemoteRateLimitBuilder {
    url: String,
    domain: String,
    descriptors: Vec<Vec<(String, KeyExtractor)>>,
    timeout: Duration,
    deny_on_failure: bool,
    breaker: BreakerConfig,
}

impl RemoteRateLimitBuilder {
    fn new(url: String, domain: String) -> Self {
        Self {
            url,
            domain,
            descriptors: Vec::new(),
            timeout: Duration::from_millis(20),
            deny_on_failure: false,
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

    /// What a request gets when the call fails or the breaker is open, as
    /// Envoy's filter says it: `false` (the default) lets it through,
    /// `true` refuses it with the breaker's wait.
    pub fn failure_mode_deny(mut self, deny: bool) -> Self {
        self.deny_on_failure = deny;
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
        let endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|_| BuildError::InvalidSetting("the rate-limit service's URL is not a URI"))?;
        BuildError::invalid_if(self.domain.is_empty(), "the rate-limit domain is empty")?;
        BuildError::invalid_if(
            self.descriptors.is_empty() || self.descriptors.iter().any(Vec::is_empty),
            "a remote rate limit needs descriptors with entries",
        )?;
        for (key, e) in self.descriptors.iter().flatten() {
            BuildError::invalid_if(key.is_empty(), "a descriptor entry's key is empty")?;
            if !e.is_sync() {
                return Err(BuildError::InvalidKey {
                    rule: format!("descriptor entry {key:?}"),
                    error:
                        "its extractor awaits; a remote descriptor reads the request head at once"
                            .into(),
                });
            }
        }
        let zero = self.timeout.is_zero();
        BuildError::invalid_if(zero, "the remote rate limit's timeout is zero")?;
        let breaker = ReportedBreaker::new(
            self.domain.as_str().into(),
            Guarded::Service,
            self.breaker,
            self.timeout,
        );
        Ok(RemoteRateLimitLayer {
            remote: Arc::new(Remote {
                domain: self.domain,
                descriptors: self.descriptors,
                endpoint,
                client: std::sync::OnceLock::new(),
                timeout: self.timeout,
                deny_on_failure: self.deny_on_failure,
                breaker,
                refusals: Refusals {
                    body: Arc::new(problem_json),
                    grpc_message: None,
                },
            }),
        })
    }
}
