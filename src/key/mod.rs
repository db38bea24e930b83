#![doc = include_str!("../../docs/key.md")]
#![doc = include_str!("../../docs/auth.md")]

use std::fmt;
use std::net::IpAddr;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// Bytes of a key's SHA-256 in the `pk` parameter: 72 bits, 12 base64 digits.
pub(crate) const PARTITION_LEN: usize = 9;

/// Keys longer than this many bytes are replaced by their SHA-256, unless a
/// builder's `max_key_len` says otherwise.
pub const DEFAULT_MAX_KEY_LEN: usize = 256;

/// The smallest key bound a builder accepts: a hashed key's 64 hex digits
/// fit whole, so distinct long keys stay distinct.
pub(crate) const MIN_MAX_KEY_LEN: usize = 64;

/// The identity a request counts against: opaque bytes, binary-safe, cheap to clone.
///
/// Keys of up to 38 bytes (API keys, IP addresses, ids) live inline, so
/// extracting one and keeping it in the local store allocate nothing;
/// longer keys share a [`Bytes`].
///
/// ```
/// use keyed_rate_limit::Key;
/// let k = Key::from("tenant-42");
/// assert_eq!(k.as_bytes(), b"tenant-42");
/// let ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
/// assert_eq!(Key::from(ip).as_bytes(), b"10.0.0.1");
/// assert_eq!(Key::copy_from_slice(b"10.0.0.1"), Key::from(ip));
/// ```
#[derive(Clone)]
pub struct Key(Repr);

const INLINE: usize = 38;

#[derive(Clone)]
enum Repr {
    Inline(u8, [u8; INLINE]),
    Shared(Bytes),
}

impl Key {
    /// A key from any bytes.
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        Self(Repr::Shared(bytes.into()))
    }

    /// A key holding a copy of `bytes`: inline when short, else in a new [`Bytes`].
    pub fn copy_from_slice(bytes: &[u8]) -> Self {
        Self::inline_with(|buf| {
            buf.get_mut(..bytes.len())
                .map(|b| b.copy_from_slice(bytes))
                .map(|()| bytes.len())
        })
        .unwrap_or_else(|| Self::new(Bytes::copy_from_slice(bytes)))
    }

    /// An inline key written by `write`, which returns the length it wrote,
    /// or `None` when it does not fit.
    fn inline_with(write: impl FnOnce(&mut [u8; INLINE]) -> Option<usize>) -> Option<Self> {
        let mut buf = [0; INLINE];
        let len = write(&mut buf)?;
        Some(Self(Repr::Inline(len as u8, buf)))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline(len, buf) => &buf[..usize::from(*len)],
            Repr::Shared(b) => b,
        }
    }

    /// The key's length in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        if self.len() <= max {
            return self;
        }
        let mut hex = hex_sha256(self.as_bytes());
        hex.truncate(max.max(1));
        Self::from(hex)
    }

    /// The draft's partition key: the first [`PARTITION_LEN`] bytes of the
    /// key's SHA-256, never the key.
    pub(crate) fn partition(&self) -> [u8; PARTITION_LEN] {
        let digest = Sha256::digest(self.as_bytes());
        let mut out = [0; PARTITION_LEN];
        out.copy_from_slice(&digest[..PARTITION_LEN]);
        out
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
        let mut hex = hex_sha256(self.as_bytes());
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

// Equal bytes are equal keys, however they are stored.
impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.fingerprint())
    }
}

impl From<&'static str> for Key {
    fn from(s: &'static str) -> Self {
        Self::new(Bytes::from_static(s.as_bytes()))
    }
}

/// `From` an owned buffer, which the key keeps as it is.
macro_rules! from_owned {
    ($($t:ty),+) => {$(
        impl From<$t> for Key {
            fn from(bytes: $t) -> Self {
                Self::new(bytes)
            }
        }
    )+};
}
from_owned!(String, Vec<u8>, Bytes);

impl From<IpAddr> for Key {
    fn from(ip: IpAddr) -> Self {
        use std::io::Write;
        Self::inline_with(|buf| {
            let mut out = &mut buf[..];
            write!(out, "{ip}").ok()?;
            Some(INLINE - out.len())
        })
        .unwrap_or_else(|| Self::from(ip.to_string()))
    }
}

impl From<u64> for Key {
    fn from(n: u64) -> Self {
        Self::copy_from_slice(itoa::Buffer::new().format(n).as_bytes())
    }
}

mod extractor;
mod forwarded;
mod ip;
pub(crate) mod lookup;
mod source;

pub(crate) use extractor::Extracted;
pub use extractor::KeyExtractor;
pub(crate) use forwarded::parse_net;
pub use forwarded::{ForwardedHeader, TrustedProxies};
pub use ip::DEFAULT_V6_PREFIX;
pub(crate) use ip::canonical;
pub use lookup::OnMissingKey;
pub(crate) use source::Misconfig;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn inline_and_shared_keys_with_equal_bytes_are_one_key() {
        let short = Key::copy_from_slice(b"api-key-1");
        assert!(matches!(short.0, Repr::Inline(..)));
        let shared = Key::new(Bytes::from_static(b"api-key-1"));
        assert_eq!(short, shared);
        assert_eq!(HashSet::from([short.clone(), shared]).len(), 1);
        assert!(Key::from("a") < Key::copy_from_slice(b"b"));

        let long = vec![b'x'; INLINE + 1];
        let k = Key::copy_from_slice(&long);
        assert!(matches!(k.0, Repr::Shared(_)));
        assert_eq!(k.as_bytes(), &long[..]);
        assert_eq!(Key::copy_from_slice(b"").len(), 0);
    }

    #[test]
    fn numbers_and_addresses_render_as_text() {
        assert_eq!(Key::from(u64::MAX).as_bytes(), b"18446744073709551615");
        let v6: IpAddr = "2001:db8:85a3:1234:5678:8a2e:370:7334".parse().unwrap();
        assert_eq!(Key::from(v6).as_bytes(), v6.to_string().as_bytes());
        // 39 characters, one more than fits inline.
        let widest: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap();
        let k = Key::from(widest);
        assert!(matches!(k.0, Repr::Shared(_)));
        assert_eq!(k.as_bytes(), widest.to_string().as_bytes());
    }
}
