//! Reloading a layer's rules when their file changes.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::{Event, RecommendedWatcher, RecursiveMode, Watcher};

use super::reload::ConfigWatcher;
use super::{ConfigError, Registry, Reloads, RulesConfig};

use crate::rate_limit::WeakLayer;
use crate::{observe, rate_limit::RateLimitLayer};

/// Editors write a file in several steps (truncate, write, rename): reload
/// once the directory has been quiet this long.
const SETTLE: Duration = Duration::from_millis(100);

/// The longest a change waits for the directory to go quiet.
const MAX_SETTLE: Duration = Duration::from_millis(500);

/// How often the reload thread checks that its watcher still exists.
const POLL: Duration = Duration::from_millis(500);

impl RulesConfig {
    /// Builds a layer from the file at `path` (as [`from_path`](Self::from_path)
    /// and [`into_layer`](Self::into_layer)) and reloads its rules whenever
    /// the file changes, for as long as the layer (or a service made from
    /// it) lives; the returned [`ConfigWatcher`] reports how the reloads
    /// went and can [`stop`](ConfigWatcher::stop) them. Starting and
    /// stopping are logged at `info` with the file's path.
    ///
    /// The file's directory is watched, so every way a file changes is
    /// seen: a write in place, a file renamed over it (editors), and the
    /// symlink swap of a mounted Kubernetes ConfigMap or Secret (`..data`
    /// repointed at a new timestamped directory), the path read through
    /// its symlinks. Each change is read once the directory has been quiet
    /// for 100 ms and, when it differs from what the running rules came
    /// from, applied with [`RateLimitLayer::reload`]: atomically, keeping the
    /// counters of rules whose name, key, algorithm, scope, `max_keys` and
    /// `on_key_space_full` stay (for a global rule, also its Redis backend,
    /// `failure_mode`, `timeout`, `breaker`, `lease` and `coalesce`), and each key's
    /// usage when only the quota changed, as the rule's `on_quota_change`
    /// says (see there). An edit that does not parse or build is rejected: the
    /// running rules stay, the error is logged with its line and column
    /// (target `keyed_rate_limit`), counted in
    /// `rate_limit_config_reloads_total{outcome="rejected"}` and kept in
    /// [`ConfigWatcher::last_error`]. The layer-wide settings (`headers`,
    /// `legacy_reset`, `instances`, `max_key_len`, `exempt_fn`) are read once: a changed
    /// one is logged and left until a restart. The rules' `registry` is
    /// kept for every reload, so the closures and Redis backend it holds
    /// serve the new rules too.
    ///
    /// The watching runs on its own thread (no Tokio runtime needed), with
    /// the `tracing` subscriber that was current here.
    ///
    /// ```
    /// use keyed_rate_limit::{Registry, RulesConfig};
    ///
    /// let dir = std::env::temp_dir().join(format!("krl-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("limits.toml");
    /// std::fs::write(&path, "[[rules]]\nname = \"api\"\nkey = \"everyone\"\nquota = \"100/min\"\n")?;
    ///
    /// let (layer, watcher) = RulesConfig::watch(&path, Registry::new())?;
    /// assert_eq!(layer.rules()[0].name(), "api");
    /// assert_eq!(watcher.reloads(), 0);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`from_path`](Self::from_path) and [`into_layer`](Self::into_layer),
    /// or the file's directory can't be watched.
    pub fn watch(
        path: impl AsRef<Path>,
        registry: Registry,
    ) -> Result<(RateLimitLayer, ConfigWatcher), ConfigError> {
        let path = path.as_ref().to_path_buf();
        let src = read(&path)?;
        let config = Self::from_named_str(&path, &src)?;
        let settings = config.layer_settings();
        let layer = config.into_layer(&registry)?;
        let cannot = |e: &dyn std::fmt::Display| {
            ConfigError::new(format!("{}: cannot watch: {e}", path.display()))
        };
        let (tx, rx) = mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |event| {
            let _ = tx.send(event);
        })
        .map_err(|e| cannot(&e))?;
        // The directory, not the file: editors replace a file by renaming another over it.
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| cannot(&e))?;
        let reloads = Reloads::new(src);
        let handle = reloads.watcher();
        let reloader = Reloader {
            path: path.clone(),
            registry,
            layer: layer.downgrade(),
            _watcher: watcher,
            settings,
            reloads,
        };
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        std::thread::Builder::new()
            .name("rate-limit-config".into())
            .spawn(move || tracing::dispatcher::with_default(&dispatch, || reloader.run(&rx)))
            .map_err(|e| cannot(&e))?;
        tracing::info!(target: observe::TARGET, path = %path.display(), "watching the rate-limit rules file");
        Ok((layer, handle))
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))
}

/// The file's settings of the layer as a whole, which a reload can't change.
#[derive(PartialEq)]
pub(super) struct LayerSettings {
    pub(super) headers: crate::headers::HeaderStyle,
    pub(super) legacy_reset: crate::headers::ResetFormat,
    pub(super) instances: Option<u32>,
    pub(super) max_key_len: Option<usize>,
    pub(super) exempt_fn: Option<String>,
}

struct Reloader {
    path: PathBuf,
    registry: Registry,
    /// Not the layer itself: the watching ends with it.
    layer: WeakLayer,
    /// Owned by the thread, so the watching lasts as long as it does.
    _watcher: RecommendedWatcher,
    settings: LayerSettings,
    reloads: Reloads,
}

impl Reloader {
    fn run(mut self, rx: &Receiver<notify::Result<Event>>) {
        let why = self.watch(rx);
        tracing::info!(target: observe::TARGET, path = %self.path.display(), why, "stopped watching the rate-limit rules file");
    }

    /// Reloads on every change until watching ends; why it did.
    fn watch(&mut self, rx: &Receiver<notify::Result<Event>>) -> &'static str {
        loop {
            // Checked at every event too: a directory that never goes quiet
            // for POLL must not keep a dropped layer's watching alive.
            if let Some(why) = self.stopped() {
                return why;
            }
            match rx.recv_timeout(POLL) {
                Ok(Ok(event)) if self.concerns(&event) => {}
                Ok(Ok(_)) | Err(RecvTimeoutError::Timeout) => continue,
                Ok(Err(e)) => {
                    tracing::warn!(target: observe::TARGET, path = %self.path.display(), error = %e, "watching the rate-limit rules failed");
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return "the file watcher failed",
            }
            // Let the rest of the edit land: wait for a quiet spell, but
            // no longer than MAX_SETTLE (a busy directory never goes quiet).
            let deadline = Instant::now() + MAX_SETTLE;
            while Instant::now() < deadline {
                match rx.recv_timeout(SETTLE) {
                    Ok(Ok(event)) if self.concerns(&event) => {}
                    Ok(_) => {}
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => return "the file watcher failed",
                }
            }
            if let Some(why) = self.stopped() {
                return why;
            }
            self.reload();
        }
    }

    fn stopped(&self) -> Option<&'static str> {
        if self.reloads.stopped() {
            Some("stopped by ConfigWatcher::stop")
        } else if self.layer.upgrade().is_none() {
            Some("the layer was dropped")
        } else {
            None
        }
    }

    /// Any change in the directory: a Kubernetes ConfigMap or Secret
    /// update swaps the `..data` symlink the file resolves through, and
    /// the file's own name never shows. What the file then reads decides.
    fn concerns(&self, event: &Event) -> bool {
        let kind = &event.kind;
        kind.is_create() || kind.is_modify() || kind.is_remove()
    }

    fn reload(&mut self) {
        let Some(layer) = self.layer.upgrade() else {
            return;
        };
        let (path, registry, settings) = (&self.path, &self.registry, &self.settings);
        self.reloads.offer(&path.display(), read(path), |src| {
            let config = RulesConfig::from_named_str(path, src)?;
            if config.layer_settings() != *settings {
                tracing::warn!(target: observe::TARGET, path = %path.display(), "headers, legacy_reset, instances, max_key_len and exempt_fn are read at start only; restart to change them");
            }
            let origin = config.origin();
            let rules = config.into_rules(registry)?;
            layer.reload(rules).map_err(|e| origin.build_error(e))
        });
    }
}
