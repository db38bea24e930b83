//! What every service and body of one bandwidth layer shares, and the step
//! from a request head to a key to shape by.

use std::num::NonZeroU32;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use http::HeaderValue;
use http::request::Parts;

use crate::engine::Meter;
use crate::gate::{Admission, Pending};
use crate::headers::{RATELIMIT_POLICY, Rendered};
use crate::key::Key;
use crate::key::lookup::{Found, Lookup};
use crate::response::{Denied, Refusals, challenge, refusal};

/// Which bodies a bandwidth limit shapes.
///
/// ```
/// use keyed_rate_limit::bandwidth::Direction;
/// assert_eq!(Direction::default(), Direction::Response);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "config",
    derive(serde::Deserialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum Direction {
    /// Response bodies: downloads, SSE, server streams (the default).
    #[default]
    Response,
    /// Request bodies: uploads, client streams.
    Request,
    /// Both, each against the key's one budget.
    Both,
}

impl Direction {
    pub(crate) fn request(self) -> bool {
        matches!(self, Self::Request | Self::Both)
    }

    pub(crate) fn response(self) -> bool {
        matches!(self, Self::Response | Self::Both)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Response => "response",
            Self::Request => "request",
            Self::Both => "both",
        }
    }
}

pub(crate) struct Shared {
    pub(super) name: Arc<str>,
    pub(super) key_name: Arc<str>,
    pub(super) meter: Meter,
    pub(super) bytes_per_second: u32,
    pub(super) burst: u32,
    /// Bytes a unit of the bucket stands for (1 up to 10⁶ bytes a second).
    pub(super) unit: u32,
    /// The most bytes taken at once, whole units: half the burst, or for
    /// a leased budget half the burst Redis counts leases in.
    pub(super) piece: NonZeroU32,
    pub(super) direction: Direction,
    pub(super) max_key_len: usize,
    pub(super) quota_member: Option<HeaderValue>,
    pub(super) deny: Refusals,
    pub(super) global: bool,
}

/// The key a request body is shaped by, from the decision to the service
/// that wraps the body; never seen by the inner service.
#[derive(Clone)]
pub(crate) struct ShapeRequest(pub(crate) Key);

/// The key a response body is shaped by, when it is.
pub(crate) type Shaping = Option<Key>;

impl Shared {
    /// Finds the key without awaiting when the extractor is sync.
    pub(crate) fn decide(
        &self,
        parts: &mut Parts,
    ) -> Result<Admission<Shaping>, BoxFuture<'static, Found>> {
        match self.meter.find(parts) {
            Lookup::Now(found) => Ok(self.admit(parts, found)),
            Lookup::Later(find) => Err(find),
        }
    }

    /// The rest of [`decide`](Self::decide), awaited.
    pub(crate) fn suspend(
        self: &Arc<Self>,
        mut parts: Parts,
        find: BoxFuture<'static, Found>,
    ) -> Pending<Shaping> {
        let this = self.clone();
        Box::pin(async move {
            let admission = this.admit(&mut parts, find.await);
            (parts, admission)
        })
    }

    fn admit(&self, parts: &mut Parts, found: Found) -> Admission<Shaping> {
        let key = match found {
            Found::Key(k) => k.bounded(self.max_key_len),
            Found::Skip => return Admission::Go(Rendered::new(), None),
            Found::Reject(status, misconfig) => {
                let denied = Denied::rejected(self.name.clone(), status, misconfig);
                let mut res = refusal(&self.deny, &denied, &parts.headers, Rendered::new());
                challenge(&mut res, &self.key_name);
                return Admission::Stop(res);
            }
        };
        let mut headers = Rendered::new();
        if let Some(p) = &self.quota_member {
            headers.push((RATELIMIT_POLICY, p.clone()));
        }
        if self.direction.request() {
            parts.extensions.insert(ShapeRequest(key.clone()));
        }
        Admission::Go(headers, self.direction.response().then_some(key))
    }
}
