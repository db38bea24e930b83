//! What a reload keeps and reports, whatever noticed the change: the
//! library's file watcher and the rate-limit service's runtime directory
//! both apply their edits through [`Reloads`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::ConfigError;
use crate::observe;

/// The reloads of one configuration: the source its running rules came
/// from, the last source rejected (judged once), and the counts a
/// [`ConfigWatcher`] reports. Each outcome is logged (target
/// `keyed_rate_limit`) and counted in `rate_limit_config_reloads_total`,
/// which the shipped `RateLimitConfigReloadRejected` alert reads.
///
/// [`RulesConfig::watch`](super::RulesConfig::watch) uses one; so does a
/// program that notices changes its own way (the `keyed-rls` binary polls
/// a runtime directory through its symlinks).
///
/// ```
/// use keyed_rate_limit::config::{ConfigError, Reloads};
///
/// let mut reloads = Reloads::new("limit: 10".to_owned());
/// let status = reloads.watcher();
/// reloads.offer(&"limits.yaml", Ok("limit: 20".to_owned()), |_| Ok(()));
/// reloads.offer(&"limits.yaml", Ok("limit: x".to_owned()), |_| Err(ConfigError::new("not a number")));
/// // The same broken source again is not judged twice.
/// reloads.offer(&"limits.yaml", Ok("limit: x".to_owned()), |_| unreachable!());
/// assert_eq!((status.reloads(), status.rejected()), (1, 1));
/// assert_eq!(status.last_error().unwrap().message(), "not a number");
/// ```
pub struct Reloads {
    applied: String,
    rejected: Option<String>,
    status: Arc<Status>,
}

impl Reloads {
    /// Reloads of rules that came from `applied`.
    pub fn new(applied: String) -> Self {
        Self {
            applied,
            rejected: None,
            status: Arc::default(),
        }
    }

    /// A handle on the counts and the last error.
    pub fn watcher(&self) -> ConfigWatcher {
        ConfigWatcher {
            status: self.status.clone(),
        }
    }

    /// Whether [`ConfigWatcher::stop`] was called on a handle.
    pub fn stopped(&self) -> bool {
        self.status.stop.load(Ordering::Acquire)
    }

    /// The source as read now from `origin`, or why it could not be read.
    /// A source that differs from the running rules' and was not rejected
    /// already is handed to `apply`, whose error rejects it (the running
    /// rules stay). A source back to the running rules' clears the last
    /// error.
    pub fn offer(
        &mut self,
        origin: &dyn std::fmt::Display,
        source: Result<String, ConfigError>,
        apply: impl FnOnce(&str) -> Result<(), ConfigError>,
    ) {
        let source = match source {
            Ok(s) => s,
            Err(e) => return self.reject(origin, e),
        };
        if source == self.applied {
            // A broken edit reverted: the source matches the running rules.
            self.set_error(None);
            return;
        }
        if self.rejected.as_deref() == Some(source.as_str()) {
            // Something else changed: this source was judged.
            return;
        }
        match apply(&source) {
            Ok(()) => {
                self.applied = source;
                self.rejected = None;
                self.status.reloads.fetch_add(1, Ordering::AcqRel);
                self.set_error(None);
                observe::config_reload(origin, None);
            }
            Err(e) => {
                self.rejected = Some(source);
                self.reject(origin, e);
            }
        }
    }

    fn set_error(&self, e: Option<ConfigError>) {
        *self
            .status
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = e;
    }

    fn reject(&self, origin: &dyn std::fmt::Display, e: ConfigError) {
        observe::config_reload(origin, Some((&e, e.line(), e.column())));
        self.status.rejected.fetch_add(1, Ordering::AcqRel);
        self.set_error(Some(e));
    }
}

impl std::fmt::Debug for Reloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloads")
            .field("status", &self.watcher())
            .finish_non_exhaustive()
    }
}

/// The status of the reloads of a layer's rules file; made by
/// [`RulesConfig::watch`](super::RulesConfig::watch).
///
/// The watching lasts as long as the layer: it stops by itself (within
/// half a second) once the layer and every service made from it are
/// dropped, or at [`stop`](Self::stop). Dropping this handle does not stop
/// it, so `let (layer, _) = RulesConfig::watch(..)?` keeps reloading.
pub struct ConfigWatcher {
    status: Arc<Status>,
}

#[derive(Default)]
struct Status {
    stop: AtomicBool,
    reloads: AtomicU64,
    rejected: AtomicU64,
    last_error: Mutex<Option<ConfigError>>,
}

impl ConfigWatcher {
    /// Stops watching (within half a second); the layer keeps the rules it
    /// has. Logged at `info`, as a stop because the layer was dropped is.
    pub fn stop(self) {
        self.status.stop.store(true, Ordering::Release);
    }

    /// Edits applied since watching began.
    pub fn reloads(&self) -> u64 {
        self.status.reloads.load(Ordering::Acquire)
    }

    /// Edits rejected (unreadable, invalid, or refused by
    /// [`RateLimitLayer::reload`](crate::RateLimitLayer::reload)) since watching began.
    pub fn rejected(&self) -> u64 {
        self.status.rejected.load(Ordering::Acquire)
    }

    /// Why the last rejected edit was rejected, with its line and column,
    /// until an edit is applied: for a health or admin endpoint.
    pub fn last_error(&self) -> Option<ConfigError> {
        self.status
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl std::fmt::Debug for ConfigWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigWatcher")
            .field("reloads", &self.reloads())
            .field("rejected", &self.rejected())
            .finish_non_exhaustive()
    }
}
