//! Unit names, validated with fleet's rules and messages.
//!
//! A `UnitName` can never escape the units directory: it has no `/`, no control or space
//! characters, and is never `.` or `..`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Longest accepted unit name, as in fleet (`unit name exceeds maximum length (256)`).
pub const MAX_NAME_LEN: usize = 256;

/// Unit types fleet knows. Declaration order is the order fleet lists them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum UnitType {
    Service,
    Socket,
    Timer,
    Path,
    Device,
    Mount,
    Automount,
}

impl UnitType {
    pub const ALL: [UnitType; 7] = [
        Self::Service,
        Self::Socket,
        Self::Timer,
        Self::Path,
        Self::Device,
        Self::Mount,
        Self::Automount,
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
        }
    }

    pub fn from_suffix(s: &str) -> Option<UnitType> {
        Self::ALL.into_iter().find(|t| t.suffix() == s)
    }

    /// systemd cannot template these.
    pub fn can_be_template(self) -> bool {
        match self {
            Self::Service | Self::Socket | Self::Timer | Self::Path => true,
            Self::Device | Self::Mount | Self::Automount => false,
        }
    }
}

/// Why a unit name was refused. Messages are fleet's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("unit name cannot be empty")]
    Empty,
    #[error("unit name exceeds maximum length ({MAX_NAME_LEN})")]
    TooLong,
    #[error("invalid character {0:?} in unit name")]
    InvalidChar(char),
    #[error("unit name must contain \".\"")]
    NoDot,
    #[error("unit name cannot end in \".\"")]
    EndsInDot,
    #[error("invalid unit type: {0:?}")]
    InvalidType(String),
    #[error("invalid unit type for template: {0:?}")]
    InvalidTemplateType(String),
    #[error("unit name cannot start in \"@\"")]
    StartsWithAt,
    #[error("unit name cannot be {0:?}")]
    Reserved(String),
}

/// A valid unit name such as `hello.service`, `web@.service` (template) or `web@1.service`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnitName {
    name: String,
    /// Byte offset of the final `.`.
    dot: usize,
    /// Byte offset of the first `@`, if any.
    at: Option<usize>,
    unit_type: UnitType,
}

impl UnitName {
    /// fleetctl's argument mangling: take the last path component and append `.service` when
    /// the name does not end in a known unit type (`foo` is `foo.service`).
    pub fn from_arg(arg: &str) -> Result<UnitName, NameError> {
        Self::with_default_type(base_name(arg)).parse()
    }

    /// `arg` with `.service` appended unless it already ends in a known unit type; used both
    /// for the unit name and for the local file fleetctl looks for.
    pub fn with_default_type(arg: &str) -> String {
        let known = arg
            .rsplit_once('.')
            .is_some_and(|(_, suffix)| UnitType::from_suffix(suffix).is_some());
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
        &self.name[..self.dot]
    }

    /// The part before `@`, or the stem when there is no `@` (`%p`).
    pub fn prefix(&self) -> &str {
        match self.at {
            Some(at) => &self.name[..at],
            None => self.stem(),
        }
    }

    /// The instance between `@` and the suffix (`%i`); empty for templates and plain units.
    pub fn instance(&self) -> &str {
        match self.at {
            Some(at) => &self.name[at + 1..self.dot],
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

fn base_name(arg: &str) -> &str {
    let trimmed = arg.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((_, base)) => base,
        None => trimmed,
    }
}

impl FromStr for UnitName {
    type Err = NameError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong);
        }
        if let Some(c) = name
            .chars()
            .find(|c| c.is_control() || c.is_whitespace() || *c == '/' || *c == '\\')
        {
            return Err(NameError::InvalidChar(c));
        }
        if name == "." || name == ".." {
            return Err(NameError::Reserved(name.to_owned()));
        }
        let Some(dot) = name.rfind('.') else {
            return Err(NameError::NoDot);
        };
        if dot == name.len() - 1 {
            return Err(NameError::EndsInDot);
        }
        let suffix = &name[dot + 1..];
        let unit_type =
            UnitType::from_suffix(suffix).ok_or_else(|| NameError::InvalidType(suffix.to_owned()))?;
        let at = name.find('@');
        if at == Some(0) {
            return Err(NameError::StartsWithAt);
        }
        if dot == 0 {
            return Err(NameError::Reserved(name.to_owned()));
        }
        if let Some(at) = at {
            if at > dot {
                return Err(NameError::InvalidType(suffix.to_owned()));
            }
            if !unit_type.can_be_template() {
                return Err(NameError::InvalidTemplateType(suffix.to_owned()));
            }
        }
        Ok(UnitName {
            name: name.to_owned(),
            dot,
            at,
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
        n.name
    }
}

impl fmt::Display for UnitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}
