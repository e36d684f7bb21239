//! What was wrong with a configuration, and where: the dotted path of the field, and its line
//! and column in the TOML text.

use std::error::Error;
use std::fmt;
use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A configuration file that could not be used: where, and what was wrong.
///
/// The error carries the line and column of the value at fault in the TOML text (or of the
/// instance, for a field that is missing); an error reading the file has neither path nor
/// position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    path: String,
    message: String,
    position: Option<(usize, usize)>,
}

impl ConfigError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            message: message.into(),
            position: None,
        }
    }

    /// A builder's refusal of a setting, at the field of the same name under `path` (the
    /// builders name their settings as the file names its fields).
    #[cfg(feature = "adaptive")]
    pub(crate) fn setting(path: &str, error: &crate::SettingError) -> Self {
        Self::new(format!("{path}.{}", error.setting()), error.to_string())
    }

    /// The text of the file at `path`, or the error naming the file that cannot be read.
    pub(crate) fn read(path: &std::path::Path) -> Result<String, Self> {
        std::fs::read_to_string(path)
            .map_err(|e| Self::new("", format!("cannot read {}: {e}", path.display())))
    }

    /// Where the error is, as a dotted path such as `rate_limiters.api.max_wait`; empty for an
    /// error of the whole file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The line and column (both from 1, the column in characters) in the TOML text, when the
    /// error came from text.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }

    /// An error of toml's reading `text` into the file's structs: a document that is not TOML
    /// (no path; the place is in the message), or a value of the wrong type or an unknown field
    /// (at the path of the key or value toml's error points to).
    pub(crate) fn from_toml(text: &str, error: &toml::de::Error) -> Self {
        let message = error.message().trim_end();
        let Some(span) = error.span() else {
            return match first_failing_line(text, message) {
                Some(line) => Self::new("", format!("{message} (line {line})")).at((line, 1)),
                None => Self::new("", message),
            };
        };
        let (line, column) = line_column(text, span.start);
        let Ok(document) = DeTable::parse(text) else {
            let message = format!("{message} (line {line}, column {column})");
            return Self::new("", message).at((line, column));
        };
        let within = |outer: &Range<usize>| outer.start <= span.start && span.end <= outer.end;
        // The deepest key holding the span (an unknown field), else the deepest value (a value
        // of the wrong type): nodes below another have longer paths. Keys first, because the
        // value of a table written `[a.b]` spans its header, which holds the key `a`.
        let nodes = nodes(&document);
        let path = deepest(&nodes, |node| node.key.as_ref().is_some_and(within))
            .or_else(|| deepest(&nodes, |node| within(&node.value)))
            .map_or_else(String::new, |node| node.path.clone());
        // serde's derive refuses a missing field at the table that lacks it (its message is
        // serde's `missing_field`): the error is the field's, placed where its instance is.
        let missing = message.strip_prefix("missing field `");
        if let Some(field) = missing.and_then(|rest| rest.strip_suffix('`')) {
            return Self::new(format!("{path}.{field}"), "is required").located_in(text);
        }
        Self::new(path, message).at((line, column))
    }

    /// This error at `position`, a line and column.
    fn at(mut self, position: (usize, usize)) -> Self {
        self.position = Some(position);
        self
    }

    /// This error with the line and column of its path in `text`, the TOML it was found in: the
    /// value at the path, or for a path that is not in the text (a missing field) the deepest
    /// part of it that is.
    pub(crate) fn located_in(mut self, text: &str) -> Self {
        if self.position.is_some() {
            return self;
        }
        let Ok(document) = DeTable::parse(text) else {
            return self;
        };
        let starts = |node: &Node| {
            let rest = self.path.strip_prefix(node.path.as_str());
            rest.is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        };
        self.position =
            deepest(&nodes(&document), starts).map(|node| match (&node.key, node.is_table) {
                // A table written as `[a.b]` is found by its name.
                (Some(key), true) => line_column(text, key.start),
                _ => line_column(text, node.value.start),
            });
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.path.as_str(), self.position) {
            ("", _) => write!(f, "invalid configuration: {}", self.message),
            (path, None) => write!(f, "invalid configuration at `{path}`: {}", self.message),
            (path, Some((line, column))) => write!(
                f,
                "invalid configuration at `{path}` (line {line}, column {column}): {}",
                self.message
            ),
        }
    }
}

impl Error for ConfigError {}

/// One key or list item of a TOML document, with its dotted path and where it is written.
struct Node {
    path: String,
    /// `None` for a list item.
    key: Option<Range<usize>>,
    value: Range<usize>,
    is_table: bool,
}

/// Every key and list item of `document`, parents before children.
fn nodes(document: &Spanned<DeTable<'_>>) -> Vec<Node> {
    /// The keys of `table`, whose path is `prefix` (empty, or ending with a dot).
    fn table(table: &DeTable<'_>, prefix: &str, out: &mut Vec<Node>) {
        for (key, value) in table {
            let path = format!("{prefix}{}", key.get_ref());
            add(path, Some(key.span()), value, out);
        }
    }
    fn add(
        path: String,
        key: Option<Range<usize>>,
        value: &Spanned<DeValue<'_>>,
        out: &mut Vec<Node>,
    ) {
        let is_table = matches!(value.get_ref(), DeValue::Table(_));
        out.push(Node {
            path: path.clone(),
            key,
            value: value.span(),
            is_table,
        });
        match value.get_ref() {
            DeValue::Table(inner) => table(inner, &format!("{path}."), out),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    add(format!("{path}[{i}]"), None, item, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    table(document.get_ref(), "", &mut out);
    out
}

/// The deepest of `nodes` that `keep` keeps (the last of those as deep).
fn deepest(nodes: &[Node], keep: impl Fn(&Node) -> bool) -> Option<&Node> {
    (nodes.iter())
        .filter(|node| keep(node))
        .max_by_key(|node| node.path.len())
}

/// The reader places some errors nowhere (keys nested past its depth limit): the first line
/// whose prefix of the file fails with the same message, found by bisection.
fn first_failing_line(text: &str, message: &str) -> Option<usize> {
    let ends: Vec<usize> = (text.match_indices('\n').map(|(i, _)| i + 1))
        .chain([text.len()])
        .collect();
    let fails = |end: &usize| {
        DeTable::parse(&text[..*end])
            .is_err_and(|e| e.span().is_none() && e.message().trim_end() == message)
    };
    let first = ends.partition_point(|end| !fails(end));
    (first < ends.len()).then_some(first + 1)
}

/// The line and column (from 1; columns in characters, as an editor shows them) of byte
/// `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.split(|&b| b == b'\n').count();
    let start_of_line = before.rsplit(|&b| b == b'\n').next().unwrap_or_default();
    let column = String::from_utf8_lossy(start_of_line).chars().count() + 1;
    (line, column)
}
