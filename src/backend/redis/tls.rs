//! The certificates of `rediss://` (feature `redis-tls`), as the builder
//! keeps them.

use std::fmt;

use redis::{ClientTlsConfig, TlsCertificates};

/// Certificates for `rediss://`; `Debug` never shows the key.
#[derive(Clone, Default)]
pub(super) struct Tls {
    pub(super) root_cert: Option<Vec<u8>>,
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
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
