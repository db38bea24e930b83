//! The rules files: read through their symlinks, loaded together, and
//! reloaded when what they hold changes (a write, or the symlink swap of
//! the runtime root by which a ConfigMap updates), through the library's
//! [`Reloads`]: logged and counted in `rate_limit_config_reloads_total`.

use std::path::PathBuf;
use std::time::Duration;

use keyed_rate_limit::config::{ConfigError, Reloads};
use keyed_rls::{RateLimitServer, RlsConfig};

use crate::env::Rules;

/// How often the files are read again: a poll follows a swap of any
/// symlink above the directory, which a watch of the directory would not.
const POLL: Duration = Duration::from_secs(1);

/// What the files hold now, read through their symlinks: the given files,
/// or the directory's `*.yaml` (and `*.yml`) files, by name.
pub(crate) fn contents(source: &Rules) -> Vec<(PathBuf, Option<String>)> {
    let files = match source {
        Rules::Files(f) => f.clone(),
        Rules::Dir { path, dotfiles } => {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
                        .filter(|p| {
                            *dotfiles
                                || !p
                                    .file_name()
                                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
                        })
                        .collect()
                })
                .unwrap_or_default();
            found.sort();
            found
        }
    };
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).ok();
            (p, text)
        })
        .collect()
}

/// The rules in what [`contents`] read: what the reload compares is what
/// it loads, read once. `merge` merges the files of one domain
/// (`MERGE_DOMAIN_CONFIG`).
pub(crate) fn load(
    source: &Rules,
    read: &[(PathBuf, Option<String>)],
    merge: bool,
) -> Result<RlsConfig, ConfigError> {
    if read.is_empty() {
        let dir = match source {
            Rules::Dir { path, .. } => path.display().to_string(),
            Rules::Files(_) => String::new(),
        };
        return Err(ConfigError::new(format!("{dir}: no *.yaml rules file")));
    }
    let mut config = RlsConfig::default();
    for (path, text) in read {
        let text = text
            .as_deref()
            .ok_or_else(|| ConfigError::new(format!("{}: cannot be read", path.display())))?;
        let file = RlsConfig::from_yaml_str(text).map_err(|e| e.in_file(path))?;
        config = if merge {
            config.merge_domains(file)
        } else {
            config.merge(file)
        }?;
    }
    Ok(config)
}

/// One text for a set of files' contents, which the reloads compare.
fn fingerprint(read: &[(PathBuf, Option<String>)]) -> String {
    let mut all = String::new();
    for (path, text) in read {
        all.push_str(&path.display().to_string());
        all.push('\0');
        all.push_str(text.as_deref().unwrap_or("\u{1}unreadable"));
        all.push('\0');
    }
    all
}

/// Reads the files every second and reloads `server` when they changed;
/// `loaded` is called after each reload applied.
pub(crate) fn spawn(
    server: RateLimitServer,
    source: Rules,
    merge: bool,
    started: &[(PathBuf, Option<String>)],
    loaded: impl Fn() + Send + 'static,
) {
    let mut reloads = Reloads::new(fingerprint(started));
    let name = match &source {
        Rules::Dir { path, .. } => path.display().to_string(),
        Rules::Files(f) => f
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL);
        loop {
            tick.tick().await;
            let now = contents(&source);
            reloads.offer(&name, Ok(fingerprint(&now)), |_| {
                server.reload(load(&source, &now, merge)?)?;
                loaded();
                Ok(())
            });
        }
    });
}
