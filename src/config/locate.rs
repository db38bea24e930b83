//! Where a rule is in the file it came from, so that a check made when the
//! layer is built (a duplicate name, a cost above the burst, a window
//! algorithm on a local rule) points at the rule as a syntax error does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::ConfigError;
use crate::error::BuildError;

/// The text and file a configuration was read from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    pub(super) src: Option<Arc<str>>,
    pub(super) path: Option<PathBuf>,
}

impl Origin {
    pub(super) fn text(src: &str) -> Self {
        Self {
            src: Some(src.into()),
            path: None,
        }
    }

    pub(super) fn in_file(mut self, path: &Path) -> Self {
        self.path = Some(path.to_owned());
        self
    }

    /// `message` about rule `name`, at the rule's `name` line (the
    /// `nth` rule of that name, from 0: a duplicate is the second).
    pub(super) fn rule_error(&self, name: &str, nth: usize, message: String) -> ConfigError {
        let found = self.src.as_deref().and_then(|src| {
            let (line, column) = name_lines(src, name).nth(nth)?;
            Some(ConfigError::at(message.clone(), src, line, column))
        });
        let e = found.unwrap_or_else(|| ConfigError::new(message));
        match &self.path {
            Some(p) => e.in_file(p),
            None => e,
        }
    }

    /// `message` about the layer-level `field`, at its line.
    pub(super) fn field_error(&self, field: &str, message: String) -> ConfigError {
        // Layer-level fields start their line, in TOML and YAML alike.
        let found = self.src.as_deref().and_then(|src| {
            let line = src.lines().position(|l| {
                l.strip_prefix(field)
                    .is_some_and(|rest| rest.trim_start().starts_with(['=', ':']))
            })?;
            Some(ConfigError::at(message.clone(), src, line + 1, 1))
        });
        let e = found.unwrap_or_else(|| ConfigError::new(message));
        match &self.path {
            Some(p) => e.in_file(p),
            None => e,
        }
    }

    /// A build error, placed at the rule it names.
    pub(super) fn build_error(&self, e: BuildError) -> ConfigError {
        let (name, nth) = match &e {
            BuildError::DuplicateRule(name) => (name.as_str(), 1),
            other => match rule_of(other) {
                Some(name) => (name, 0),
                None => return ConfigError::from(e),
            },
        };
        self.rule_error(name, nth, e.to_string())
    }
}

/// The rule a build error is about, if it is about one.
fn rule_of(e: &BuildError) -> Option<&str> {
    match e {
        BuildError::DuplicateRule(rule) | BuildError::InvalidRuleName(rule) => Some(rule),
        BuildError::InvalidQuota { rule, .. }
        | BuildError::CostAboveCapacity { rule, .. }
        | BuildError::AlgorithmNotLocal { rule, .. }
        | BuildError::BurstNotSupported { rule, .. }
        | BuildError::InvalidKey { rule, .. }
        | BuildError::InvalidExemptIp { rule, .. } => Some(rule),
        _ => None,
    }
}

/// The 1-based line and column of each `name = "x"` (TOML) or
/// `name: x` / `- name: x` (YAML) whose value is `name`.
fn name_lines<'a>(src: &'a str, name: &'a str) -> impl Iterator<Item = (usize, usize)> + 'a {
    src.lines().enumerate().filter_map(move |(i, line)| {
        let t = line.trim_start();
        let t = t.strip_prefix('-').map_or(t, str::trim_start);
        let column = line.len() - t.len() + 1;
        let rest = t.strip_prefix("name")?.trim_start();
        let value = rest.strip_prefix('=').or_else(|| rest.strip_prefix(':'))?;
        let value = value.split(" #").next().unwrap_or("").trim();
        let unquoted = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        (unquoted == name).then_some((i + 1, column))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_toml_and_yaml_rule_names() {
        let toml = "[[rules]]\nname = \"a\"\n[[rules]]\n  name='b' # x\n";
        assert_eq!(name_lines(toml, "b").collect::<Vec<_>>(), [(4, 3)]);
        let yaml = "rules:\n  - name: a\n    key: everyone\n  - name: \"a\"\n";
        assert_eq!(name_lines(yaml, "a").collect::<Vec<_>>(), [(2, 5), (4, 5)]);
        assert_eq!(name_lines(yaml, "c").count(), 0);
    }
}
