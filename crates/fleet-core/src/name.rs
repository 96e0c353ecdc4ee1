//! Unit names, validated with fleet's rules, in fleet's order, with fleet's messages
//! (`api/units.go:ValidateName`), and fleetctl's mangling of command-line arguments.
//!
//! A `UnitName` can never escape the units directory: before its type suffix it holds only
//! ASCII letters, digits and `:-_.\@`, so no `/`, no control or space characters, and it is
//! never `.` or `..`. It does not know about files or the registry.

use crate::quote::{quote, quote_char};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Longest accepted unit name, as in fleet (`unit name exceeds maximum length (256)`).
pub const MAX_NAME_LEN: usize = 256;

/// Characters allowed before the type suffix, besides ASCII letters and digits (systemd's).
const VALID_PUNCTUATION: &str = ":-_.\\@";

/// Unit types fleet knows. The first seven, in the order fleetctl lists them, are the ones
/// fleetctl recognizes in an argument; the API also accepts the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnitType {
    Service,
    Socket,
    Timer,
    Path,
    Device,
    Mount,
    Automount,
    Target,
    Slice,
    Swap,
    Scope,
    Busname,
    Snapshot,
}

impl UnitType {
    /// The types fleetctl recognizes at the end of an argument (`unit.RecognizedUnitType`);
    /// any other name gets `.service` appended, so `foo.target` is `foo.target.service`.
    pub const ALL: [UnitType; 7] = [
        Self::Service,
        Self::Socket,
        Self::Timer,
        Self::Path,
        Self::Device,
        Self::Mount,
        Self::Automount,
    ];

    /// Every type the API accepts in a unit name: [`UnitType::ALL`] and six more.
    pub const ACCEPTED: [UnitType; 13] = [
        Self::Service,
        Self::Socket,
        Self::Timer,
        Self::Path,
        Self::Device,
        Self::Mount,
        Self::Automount,
        Self::Target,
        Self::Slice,
        Self::Swap,
        Self::Scope,
        Self::Busname,
        Self::Snapshot,
    ];

    /// The suffix without the dot: `service`.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Service => "service",
            Self::Socket => "socket",
            Self::Timer => "timer",
            Self::Path => "path",
            Self::Device => "device",
            Self::Mount => "mount",
            Self::Automount => "automount",
            Self::Target => "target",
            Self::Slice => "slice",
            Self::Swap => "swap",
            Self::Scope => "scope",
            Self::Busname => "busname",
            Self::Snapshot => "snapshot",
        }
    }

    /// The type for an exact, case-sensitive suffix among all [`UnitType::ACCEPTED`].
    pub fn from_suffix(s: &str) -> Option<UnitType> {
        Self::ACCEPTED.into_iter().find(|t| t.suffix() == s)
    }

    /// Whether fleetctl keeps an argument ending in this type instead of appending `.service`.
    pub fn recognized_by_fleetctl(self) -> bool {
        Self::ALL.contains(&self)
    }

    /// Whether a name of this type may contain `@` (fleet's `validTemplateTypes`).
    pub fn can_be_template(self) -> bool {
        match self {
            Self::Service | Self::Socket | Self::Timer | Self::Path | Self::Target => true,
            Self::Device
            | Self::Mount
            | Self::Automount
            | Self::Slice
            | Self::Swap
            | Self::Scope
            | Self::Busname
            | Self::Snapshot => false,
        }
    }
}

/// Why a unit name was refused. Messages are fleet's, `%q` quoting included.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("unit name cannot be empty")]
    Empty,
    #[error("unit name exceeds maximum length ({MAX_NAME_LEN})")]
    TooLong,
    #[error("invalid character {} in unit name", quote_char(*.0))]
    InvalidChar(char),
    #[error("unit name must contain \".\"")]
    NoDot,
    #[error("unit name cannot end in \".\"")]
    EndsInDot,
    #[error("invalid unit type: {}", quote(.0))]
    InvalidType(String),
    #[error("invalid unit type for template: {}", quote(.0))]
    InvalidTemplateType(String),
    #[error("unit name cannot start in \"@\"")]
    StartsWithAt,
    /// Nothing before the type suffix (`.service`): fleet would take it, systemd refuses it.
    #[error("unit name cannot be {}", quote(.0))]
    Reserved(String),
}

/// A valid unit name such as `hello.service`, `web@.service` (template) or `web@1.service`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnitName {
    /// Shared by every clone: the engine's view holds each name in several maps, and a
    /// million units made the copies count (docs/benchmarks.md, "A million units").
    name: Arc<str>,
    /// Byte offset of the final `.` (names are at most [`MAX_NAME_LEN`] bytes).
    dot: u16,
    /// Byte offset of the first `@`, if any.
    at: Option<u16>,
    unit_type: UnitType,
}

impl UnitName {
    /// fleetctl's argument mangling: take the last path component (Go's `path.Base`) and
    /// append `.service` unless it ends in a type fleetctl recognizes (`foo` is `foo.service`,
    /// `dir/foo.target` is `foo.target.service`).
    ///
    /// An empty argument, `.` or `..` names no unit: Go's `path.Base` makes `""` into `.`, and
    /// appending `.service` would turn it into the real name `..service`.
    pub fn from_arg(arg: &str) -> Result<UnitName, NameError> {
        if arg.is_empty() {
            return Err(NameError::Empty);
        }
        let base = base_name(arg);
        if base == "." || base == ".." {
            return Err(NameError::Reserved(base.to_owned()));
        }
        Self::with_default_type(base).parse()
    }

    /// `arg` with `.service` appended unless it already ends in a known unit type; used both
    /// for the unit name and for the local file fleetctl looks for.
    pub fn with_default_type(arg: &str) -> String {
        let known = arg.rsplit_once('.').is_some_and(|(_, suffix)| {
            UnitType::from_suffix(suffix).is_some_and(UnitType::recognized_by_fleetctl)
        });
        if known {
            arg.to_owned()
        } else {
            format!("{arg}.service")
        }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    pub fn unit_type(&self) -> UnitType {
        self.unit_type
    }

    /// The name without its type suffix (`%N`): `web@1` for `web@1.service`.
    pub fn stem(&self) -> &str {
        &self.name[..self.dot as usize]
    }

    /// The part before `@`, or the stem when there is no `@` (`%p`).
    pub fn prefix(&self) -> &str {
        match self.at {
            Some(at) => &self.name[..at as usize],
            None => self.stem(),
        }
    }

    /// The instance between `@` and the suffix (`%i`); empty for templates and plain units.
    pub fn instance(&self) -> &str {
        match self.at {
            Some(at) => &self.name[at as usize + 1..self.dot as usize],
            None => "",
        }
    }

    /// `web@.service`: a template, which can be submitted but never loaded or started.
    pub fn is_template(&self) -> bool {
        self.at.is_some() && self.instance().is_empty()
    }

    /// `web@1.service`: an instance of a template.
    pub fn is_instance(&self) -> bool {
        self.at.is_some() && !self.instance().is_empty()
    }

    /// The template an instance comes from: `web@.service` for `web@1.service`.
    pub fn template(&self) -> Option<UnitName> {
        if !self.is_instance() {
            return None;
        }
        let name = format!("{}@.{}", self.prefix(), self.unit_type.suffix());
        name.parse().ok()
    }
}

/// Go's `path.Base`: `""` is `"."` and a path of only slashes is `"/"`.
fn base_name(arg: &str) -> &str {
    if arg.is_empty() {
        return ".";
    }
    let trimmed = arg.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/";
    }
    match trimmed.rsplit_once('/') {
        Some((_, base)) => base,
        None => trimmed,
    }
}

/// Whether `c` may appear in a unit name before its type suffix.
pub(crate) fn is_valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || VALID_PUNCTUATION.contains(c)
}

impl FromStr for UnitName {
    type Err = NameError;
    /// fleet's checks in fleet's order, so a name with several faults gets fleet's message.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        let Some(dot) = name.rfind('.') else {
            return Err(NameError::NoDot);
        };
        if dot == name.len() - 1 {
            return Err(NameError::EndsInDot);
        }
        let suffix = &name[dot + 1..];
        let unit_type = UnitType::from_suffix(suffix)
            .ok_or_else(|| NameError::InvalidType(suffix.to_owned()))?;
        let at = name.find('@');
        if at.is_some() && !unit_type.can_be_template() {
            return Err(NameError::InvalidTemplateType(suffix.to_owned()));
        }
        if let Some(c) = name[..dot].chars().find(|c| !is_valid_char(*c)) {
            return Err(NameError::InvalidChar(c));
        }
        if at == Some(0) {
            return Err(NameError::StartsWithAt);
        }
        if dot == 0 {
            return Err(NameError::Reserved(name.to_owned()));
        }
        // Both fit: the name is at most MAX_NAME_LEN bytes.
        let offset = |i: usize| u16::try_from(i).expect("a unit name is short");
        Ok(UnitName {
            name: Arc::from(name),
            dot: offset(dot),
            at: at.map(offset),
            unit_type,
        })
    }
}

impl TryFrom<String> for UnitName {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<UnitName> for String {
    fn from(n: UnitName) -> String {
        n.name.to_string()
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests;
