//! Keys: who a request counts against.
//!
//! A [`KeyExtractor`] turns a request's head into a [`Key`], or into nothing
//! when the request carries no such identity. Extractors are closures, sync or
//! async, plus the built-ins on [`KeyExtractor`].

use std::fmt;
use std::net::IpAddr;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The identity a request counts against: opaque bytes, binary-safe, cheap to clone.
///
/// ```
/// use keyed_rate_limit::Key;
/// let k = Key::from("tenant-42");
/// assert_eq!(k.as_bytes(), b"tenant-42");
/// let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
/// assert_eq!(Key::from(ip).as_bytes(), b"10.0.0.1");
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Bytes);

impl Key {
    /// A key from any bytes.
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        Self(bytes.into())
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The key's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keeps keys at most `max` bytes long: a longer key is replaced by the
    /// hex SHA-256 of its bytes (64 bytes, or its first `max` bytes when `max` is smaller),
    /// so memory per key stays bounded and distinct long keys stay distinct.
    ///
    /// ```
    /// # use keyed_rate_limit::Key;
    /// let long = Key::from("x".repeat(1000));
    /// let k = long.bounded(128);
    /// assert_eq!(k.len(), 64);
    /// assert_eq!(Key::from("short").bounded(128), Key::from("short"));
    /// ```
    pub fn bounded(self, max: usize) -> Self {
        if self.0.len() <= max {
            return self;
        }
        let mut hex = hex_sha256(&self.0);
        hex.truncate(max.max(1));
        Self(Bytes::from(hex))
    }

    /// A short, stable fingerprint for logs: never log raw keys (API keys are secrets).
    ///
    /// ```
    /// # use keyed_rate_limit::Key;
    /// let f = Key::from("secret-api-key").fingerprint();
    /// assert_eq!(f.len(), 16);
    /// assert!(!f.contains("secret"));
    /// ```
    pub fn fingerprint(&self) -> String {
        let mut hex = hex_sha256(&self.0);
        hex.truncate(16);
        hex
    }
}

fn hex_sha256(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.fingerprint())
    }
}

impl From<&'static str> for Key {
    fn from(s: &'static str) -> Self {
        Self(Bytes::from_static(s.as_bytes()))
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Self(Bytes::from(s))
    }
}

impl From<Vec<u8>> for Key {
    fn from(v: Vec<u8>) -> Self {
        Self(Bytes::from(v))
    }
}

impl From<Bytes> for Key {
    fn from(b: Bytes) -> Self {
        Self(b)
    }
}

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        Self(Bytes::from(ip.to_string()))
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Self(Bytes::from(n.to_string()))
    }
}

mod extractor;
mod forwarded;

pub(crate) use extractor::Extracted;
pub use extractor::KeyExtractor;
pub use forwarded::{ForwardedHeader, TrustedProxies};
