//! systemd unit files: parsing, the canonical text, and its SHA-1 hash.
//!
//! The canonical text is fleet's serialization (options grouped by section in order of first
//! appearance, `Name=Value` lines, one blank line between sections), so a hash computed here
//! equals the hash fleet showed its users for the same file.

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::fmt;
use std::str::FromStr;

/// Longest physical line accepted, as systemd's `LINE_MAX` and fleet's parser.
pub const MAX_LINE_BYTES: usize = 2048;

/// Largest unit file accepted. etcd refuses requests over 1.5 MiB by default; a unit file and
/// its records must fit in one transaction, so the limit sits well below that.
pub const MAX_UNIT_FILE_BYTES: usize = 1024 * 1024;

/// One `Name=Value` line of a section.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitOption {
    pub section: String,
    pub name: String,
    pub value: String,
}

/// A parsed unit file. Options keep their order; repeated keys are all kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    options: Vec<UnitOption>,
}

/// Why a unit file was refused. Line numbers are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unit file is not valid UTF-8 (line {line})")]
    NotUtf8 { line: usize },
    #[error("line {line} too long (max {MAX_LINE_BYTES} bytes)")]
    LineTooLong { line: usize },
    #[error("unit file too large ({size} bytes, max {MAX_UNIT_FILE_BYTES})")]
    TooLarge { size: usize },
    #[error("line {line}: unterminated section header")]
    UnterminatedSection { line: usize },
    #[error("line {line}: option {name:?} outside of any section")]
    OutsideSection { line: usize, name: String },
    #[error("line {line}: expected Name=Value, found {text:?}")]
    NotAnAssignment { line: usize, text: String },
    #[error("line {line}: empty option name")]
    EmptyName { line: usize },
    #[error("unit file has no options")]
    Empty,
}

impl UnitFile {
    /// Parses a unit file: sections, `Name=Value`, `#`/`;` comments, blank lines, backslash
    /// continuations (kept in the value as `\` + newline, as fleet does), repeated keys in order,
    /// repeated `[Section]` headers merged.
    pub fn parse(bytes: &[u8]) -> Result<UnitFile, ParseError> {
        if bytes.len() > MAX_UNIT_FILE_BYTES {
            return Err(ParseError::TooLarge { size: bytes.len() });
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ParseError::NotUtf8 {
            line: 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count(),
        })?;
        let mut options = Vec::new();
        let mut section: Option<String> = None;
        let mut lines = text.split('\n').enumerate().peekable();
        while let Some((idx, raw)) = lines.next() {
            let line_no = idx + 1;
            let raw = raw.strip_suffix('\r').unwrap_or(raw);
            if raw.len() > MAX_LINE_BYTES {
                return Err(ParseError::LineTooLong { line: line_no });
            }
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let Some(name) = rest.strip_suffix(']') else {
                    return Err(ParseError::UnterminatedSection { line: line_no });
                };
                section = Some(name.to_owned());
                continue;
            }
            let Some((name, first)) = line.split_once('=') else {
                return Err(ParseError::NotAnAssignment {
                    line: line_no,
                    text: line.to_owned(),
                });
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(ParseError::EmptyName { line: line_no });
            }
            let Some(section) = &section else {
                return Err(ParseError::OutsideSection {
                    line: line_no,
                    name: name.to_owned(),
                });
            };
            let mut value = first.to_owned();
            while value.ends_with('\\') {
                let Some((next_idx, next)) = lines.next() else {
                    break;
                };
                let next = next.strip_suffix('\r').unwrap_or(next);
                if next.len() > MAX_LINE_BYTES {
                    return Err(ParseError::LineTooLong { line: next_idx + 1 });
                }
                value.push('\n');
                value.push_str(next);
            }
            options.push(UnitOption {
                section: section.clone(),
                name: name.to_owned(),
                value: value.trim().to_owned(),
            });
        }
        if options.is_empty() {
            return Err(ParseError::Empty);
        }
        Ok(UnitFile { options })
    }

    /// Builds a unit file from options (for instance ones read back from the registry).
    pub fn from_options(options: Vec<UnitOption>) -> UnitFile {
        UnitFile { options }
    }

    pub fn options(&self) -> &[UnitOption] {
        &self.options
    }

    /// Every value of `name` in `section`, in file order.
    pub fn values<'a>(&'a self, section: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> {
        self.options
            .iter()
            .filter(move |o| o.section == section && o.name == name)
            .map(|o| o.value.as_str())
    }

    /// Whether the file has at least one option in `section`.
    pub fn has_section(&self, section: &str) -> bool {
        self.options.iter().any(|o| o.section == section)
    }

    /// `[Unit] Description=`, first value.
    pub fn description(&self) -> Option<&str> {
        self.values("Unit", "Description").next()
    }

    /// fleet's canonical serialization; the hash is taken over exactly these bytes.
    pub fn canonical(&self) -> String {
        let mut sections: Vec<&str> = Vec::new();
        for o in &self.options {
            if !sections.contains(&o.section.as_str()) {
                sections.push(&o.section);
            }
        }
        let mut out = String::new();
        for (i, section) in sections.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push('[');
            out.push_str(section);
            out.push_str("]\n");
            for o in self.options.iter().filter(|o| o.section == *section) {
                out.push_str(&o.name);
                out.push('=');
                out.push_str(&o.value);
                out.push('\n');
            }
        }
        out
    }

    pub fn hash(&self) -> UnitHash {
        UnitHash(Sha1::digest(self.canonical().as_bytes()).into())
    }
}

/// SHA-1 of a unit file's canonical text.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnitHash([u8; 20]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid unit hash {0:?}: expected 40 hex digits")]
pub struct HashError(pub String);

impl UnitHash {
    pub fn of_bytes(canonical: &[u8]) -> UnitHash {
        UnitHash(Sha1::digest(canonical).into())
    }

    /// The 7-character form fleet prints.
    pub fn short(&self) -> String {
        let mut s = self.to_string();
        s.truncate(7);
        s
    }
}

impl fmt::Display for UnitHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for UnitHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UnitHash({self})")
    }
}

impl FromStr for UnitHash {
    type Err = HashError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || HashError(s.to_owned());
        if s.len() != 40 {
            return Err(bad());
        }
        let mut out = [0u8; 20];
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let hex = std::str::from_utf8(chunk).map_err(|_| bad())?;
            if !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(bad());
            }
            out[i] = u8::from_str_radix(hex, 16).map_err(|_| bad())?;
        }
        Ok(UnitHash(out))
    }
}

impl TryFrom<String> for UnitHash {
    type Error = HashError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<UnitHash> for String {
    fn from(h: UnitHash) -> String {
        h.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_fleets_own_vectors() {
        let hello = "[Service]\nExecStart=/bin/bash -c \"while true; do echo Hello, World!; sleep 1; done\"\n";
        let unit = UnitFile::parse(hello.as_bytes()).unwrap();
        assert_eq!(unit.hash().to_string(), "3750b3e9f3962a56c7582929426e9abb012754cf");
        assert_eq!(unit.hash().short(), "3750b3e");

        let example = "[Unit]\nDescription=Hello World\n\n[Service]\nExecStart=/bin/bash -c \"while true; do echo \\\"Hello, world\\\"; sleep 1; done\"\n";
        let unit = UnitFile::parse(example.as_bytes()).unwrap();
        assert_eq!(unit.hash().to_string(), "e55c0aeb44ba0b68004ceb8a200e685194448b45");
    }
}
