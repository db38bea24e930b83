//! [`ConfigError`]: what is wrong with a configuration, and where.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::BuildError;

/// Why a configuration could not be read or turned into a layer.
///
/// Syntax and value errors carry the 1-based line and column they were
/// found at; the message names the field.
///
/// ```
/// use keyed_rate_limit::RulesConfig;
///
/// let err = RulesConfig::from_toml_str("[[rules]]\nname = \"a\"\nkey = \"everyone\"\nquota = \"100/fortnight\"\n")
///     .unwrap_err();
/// assert_eq!((err.line(), err.column()), (Some(4), Some(9)));
/// assert!(err.to_string().starts_with("line 4, column 9: invalid quota \"100/fortnight\""));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
    path: Option<PathBuf>,
    line: Option<usize>,
    column: Option<usize>,
}

impl ConfigError {
    /// What is wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The file the configuration came from, when it was read from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The 1-based line of the offending value, when known.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// The 1-based column of the offending value, when known.
    pub fn column(&self) -> Option<usize> {
        self.column
    }

    /// An error with no place, for a program that reads a file of its own
    /// (as `keyed-rls` reads envoyproxy/ratelimit's YAML).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            path: None,
            line: None,
            column: None,
        }
    }

    /// An error at the 1-based `line` and `column` of `src`, which the
    /// message quotes.
    ///
    /// ```
    /// use keyed_rate_limit::config::ConfigError;
    ///
    /// let err = ConfigError::at("unknown field `unit`", "a: 1\nunit: 2\n", 2, 1);
    /// assert_eq!(err.to_string(), "line 2, column 1: unknown field `unit`\n  2 | unit: 2");
    /// ```
    pub fn at(message: impl Into<String>, src: &str, line: usize, column: usize) -> Self {
        let mut message = message.into();
        // Quote the line, so the field is named whatever the message says.
        if let Some(text) = src.lines().nth(line.wrapping_sub(1)) {
            message = format!("{message}\n  {line} | {}", text.trim_end());
        }
        Self {
            line: Some(line),
            column: Some(column),
            ..Self::new(message)
        }
    }

    /// The error, in the file at `path`.
    pub fn in_file(mut self, path: &Path) -> Self {
        self.path = Some(path.to_owned());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `path:line:column:`, as compilers write it, when read from a file.
        match (&self.path, self.line, self.column) {
            (Some(p), Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", p.display(), self.message),
            (Some(p), _, _) => write!(f, "{}: {}", p.display(), self.message),
            (None, Some(l), Some(c)) => write!(f, "line {l}, column {c}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<BuildError> for ConfigError {
    fn from(e: BuildError) -> Self {
        Self::new(e.to_string())
    }
}

crate::util::report::debug_as_display!(ConfigError);
