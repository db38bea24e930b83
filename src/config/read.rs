//! Reading a configuration: TOML or YAML text, or a file by its extension,
//! into a [`RulesConfig`], with the line and column of any error.

use std::path::Path;

use super::error::ConfigError;
use super::locate::Origin;
use super::schema::RulesConfig;

/// A YAML error with the line and column it carries.
pub(crate) fn yaml_error(e: &serde_norway::Error, src: &str) -> ConfigError {
    let text = e.to_string();
    match e.location() {
        Some(loc) => {
            // The message already names the path; drop its own " at line …".
            let msg = text.rsplit_once(" at line ").map_or(&*text, |(m, _)| m);
            ConfigError::at(msg, src, loc.line(), loc.column())
        }
        None => ConfigError::new(text),
    }
}

impl RulesConfig {
    /// Reads a TOML configuration.
    ///
    /// # Errors
    ///
    /// Invalid TOML, unknown fields, or a bad value, with its line and column.
    pub fn from_toml_str(src: &str) -> Result<Self, ConfigError> {
        let parsed: Result<Self, _> = toml::from_str(src);
        parsed.map(|c| c.read_from(src)).map_err(|e| {
            let Some(span) = e.span() else {
                return ConfigError::new(e.message());
            };
            let before = &src[..span.start.min(src.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            ConfigError::at(e.message().trim_end(), src, line, column)
        })
    }

    /// Reads a YAML configuration.
    ///
    /// # Errors
    ///
    /// Invalid YAML, unknown fields, or a bad value, with its line and column.
    pub fn from_yaml_str(src: &str) -> Result<Self, ConfigError> {
        let parsed: Result<Self, _> = serde_norway::from_str(src);
        parsed
            .map(|c| c.read_from(src))
            .map_err(|e| yaml_error(&e, src))
    }

    /// Reads a file: YAML when it ends in `.yaml` or `.yml`, TOML otherwise.
    ///
    /// # Errors
    ///
    /// The file can't be read, or [`from_toml_str`](Self::from_toml_str) /
    /// [`from_yaml_str`](Self::from_yaml_str) fails; the message starts with the path.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let src = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(format!("{}: {e}", path.display())))?;
        Self::from_named_str(path, &src)
    }

    /// Parses `src`, read from `path`: YAML or TOML by the extension, with
    /// the path in front of any error.
    pub(super) fn from_named_str(path: &Path, src: &str) -> Result<Self, ConfigError> {
        let yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        let parsed = if yaml {
            Self::from_yaml_str(src)
        } else {
            Self::from_toml_str(src)
        };
        parsed
            .map(|mut c| {
                c.origin = c.origin.in_file(path);
                c
            })
            .map_err(|e| e.in_file(path))
    }

    fn read_from(mut self, src: &str) -> Self {
        self.origin = Origin::text(src);
        self
    }

    /// The rules' names, in evaluation order.
    pub fn rule_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.raw.name.as_str())
    }
}
