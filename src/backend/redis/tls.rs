//! `rediss://` with certificates of the caller's choosing (feature `redis-tls`).

use std::fmt;

use redis::{ClientTlsConfig, TlsCertificates};

use super::RedisBackendBuilder;

/// Certificates for `rediss://`; `Debug` never shows the key.
#[derive(Clone, Default)]
pub(super) struct Tls {
    root_cert: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("root_cert", &self.root_cert.is_some())
            .field("client_cert", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        if self.root_cert.is_none() && self.client.is_none() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self
                .client
                .clone()
                .map(|(client_cert, client_key)| ClientTlsConfig {
                    client_cert,
                    client_key,
                }),
            root_cert: self.root_cert.clone(),
        })
    }
}

#[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
impl RedisBackendBuilder {
    /// For `rediss://`: trust this PEM root certificate instead of the
    /// system's store, e.g. a private CA. Multiplexed and cluster modes.
    ///
    /// ```
    /// # use keyed_rate_limit::backend::redis::RedisBackend;
    /// let ca = b"-----BEGIN CERTIFICATE-----\n...".to_vec();
    /// let builder = RedisBackend::builder("rediss://redis.internal:6380").tls_root_cert(ca);
    /// ```
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` with mutual TLS: the client certificate and key, PEM.
    /// Multiplexed and cluster modes.
    ///
    /// ```
    /// # use keyed_rate_limit::backend::redis::RedisBackend;
    /// let (cert, key) = (b"-----BEGIN CERTIFICATE-----".to_vec(), b"-----BEGIN PRIVATE KEY-----".to_vec());
    /// let builder = RedisBackend::builder("rediss://redis.internal:6380").tls_client_cert(cert, key);
    /// ```
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }
}
