//! This gateway's entry in the live instance count: its id and TTL, and
//! the count it last read.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use super::{keys, script};
use crate::failure::LiveCount;

/// This gateway's membership: its id, its TTL, and the count it reads.
#[derive(Debug)]
pub(crate) struct Membership {
    pub(crate) id: String,
    pub(crate) ttl: Duration,
    pub(crate) count: Arc<LiveCount>,
}

impl Membership {
    pub(crate) fn new(ttl: Duration, id: Option<String>) -> Self {
        Self {
            // Without one, one id per process: a gateway with several
            // backends on one Redis and prefix counts once.
            id: id.unwrap_or_else(|| process_id().to_owned()),
            ttl,
            count: Arc::default(),
        }
    }

    /// This gateway's departure from the count, for a backend being dropped.
    pub(crate) fn leave(&self, prefix: &str) -> redis::ScriptInvocation<'static> {
        script::instances(set_key(prefix), &self.id, self.ttl, true)
    }
}

/// This process's id: the pid and the time it was first asked for (a
/// restarted process may reuse its pid).
pub(crate) fn process_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos:x}", std::process::id())
    })
}

/// The set every gateway on this prefix announces itself in.
pub(super) fn set_key(prefix: &str) -> Vec<u8> {
    keys::tagged_key(prefix, "instances", &crate::key::Key::from("*"), b"live")
}
