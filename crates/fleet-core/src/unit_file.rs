//! systemd unit files: parsing, the canonical text, and its SHA-1 hash.
//!
//! The canonical text is fleet's serialization (options grouped by section in order of first
//! appearance, `Name=Value` lines, one blank line between sections), so a hash computed here
//! equals the hash fleet showed its users for the same file.

use serde::{Deserialize, Serialize};
use sha1::{Digest, Sha1};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// systemd's `LINE_MAX`: go-systemd (fleet's reader) refuses a line that does not end within
/// this many bytes rather than let systemd truncate it silently, where its read buffer lets it
/// see the line (the `lexer` module says where).
pub const MAX_LINE_BYTES: usize = 2048;

/// Largest unit file accepted. etcd refuses requests over 1.5 MiB by default; a unit file and
/// its records must fit in one transaction, so the limit sits well below that.
pub const MAX_UNIT_FILE_BYTES: usize = 1024 * 1024;

/// Largest unit file accepted in fleet's API form: its options as the JSON array of
/// `{"section","name","value"}` objects that the API's unit entity carries. That form repeats
/// the section name on every option, so a file of many short options within
/// [`MAX_UNIT_FILE_BYTES`] could be more than the API takes in a request body (4 MiB); such a
/// file is refused by both drivers alike, with room left in the body for the rest of the
/// entity.
pub const MAX_API_FORM_BYTES: usize = 3 * 1024 * 1024;

/// `{"section":"","name":"","value":""},`
const API_FORM_PER_OPTION: usize = 36;

/// One `Name=Value` line of a section.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UnitOption {
    pub section: String,
    pub name: String,
    pub value: String,
}

/// A parsed unit file. Options keep their order; repeated keys are all kept.
///
/// Two unit files are equal when their canonical texts are, hence their hashes: options of
/// different sections may be interleaved differently (fleet's `unit.MatchUnitFiles`).
///
/// The options are shared, never changed: a clone costs a count, not a copy. A listing of
/// 100,000 instances of a few templates gives each unit's view its file, and copying it cost
/// fleetctl 22 MB and 700,000 allocations at that size (issue 19, heaptrack).
#[derive(Debug, Clone)]
pub struct UnitFile {
    options: Arc<[UnitOption]>,
}

impl PartialEq for UnitFile {
    fn eq(&self, other: &Self) -> bool {
        self.canonical() == other.canonical()
    }
}

impl Eq for UnitFile {}

/// Why a unit file was refused: where fleet's reader refuses it, for the same reason. Line
/// numbers are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line {line} too long (max {MAX_LINE_BYTES} bytes)")]
    LineTooLong { line: usize },
    #[error("unit file too large ({size} bytes, max {MAX_UNIT_FILE_BYTES})")]
    TooLarge { size: usize },
    #[error("line {line}: unterminated section header")]
    UnterminatedSection { line: usize },
    #[error("line {line}: found garbage after section name {section:?}")]
    GarbageAfterSection { line: usize, section: String },
    #[error("line {line}: expected Name=Value, found {text:?}")]
    NotAnAssignment { line: usize, text: String },
    #[error(
        "unit file too large in fleet's API form ({size} bytes of options, max {MAX_API_FORM_BYTES}): fewer, longer options fit"
    )]
    ApiFormTooLarge { size: usize },
    /// fleet stores the text it serializes from the options and reads that back.
    #[error("the unit file as fleet would store it does not read back: {0}")]
    Reread(Box<ParseError>),
}

impl UnitFile {
    /// Parses a unit file into the options fleet v1.0 shows for it, or refuses it where fleet
    /// refuses it, so that the hash is fleet's (`tests/fleet_hashes/` holds the files this was
    /// checked on, with the hashes fleet's own binaries gave).
    ///
    /// fleet reads the file with go-systemd's reader (`unit_file::lexer`), stores the text it
    /// serializes from the options as a JSON string (invalid UTF-8 becomes U+FFFD, one per
    /// byte), and every reader of its registry parses that text again: the options and hash
    /// fleet shows are those of the second reading. For ordinary files both readings agree;
    /// they differ for a value ending in a `\` that continues nothing, which the second
    /// reading joins with the next line, as systemd would.
    pub fn parse(bytes: &[u8]) -> Result<UnitFile, ParseError> {
        if bytes.len() > MAX_UNIT_FILE_BYTES {
            return Err(ParseError::TooLarge { size: bytes.len() });
        }
        let stored = go_lossy(&serialize_raw(&lexer::read(bytes)?));
        let options = lexer::read(stored.as_bytes())
            .map_err(|e| ParseError::Reread(Box::new(e)))?
            .into_iter()
            .map(|o| UnitOption {
                section: String::from_utf8_lossy(&o.section).into_owned(),
                name: String::from_utf8_lossy(&o.name).into_owned(),
                value: String::from_utf8_lossy(&o.value).into_owned(),
            })
            .collect::<Vec<_>>();
        let file = UnitFile {
            options: options.into(),
        };
        // The registry stores the canonical text, which can be longer than the file as
        // written (headers repeated per merged section): that is what must fit.
        let size = file.canonical_len();
        if size > MAX_UNIT_FILE_BYTES {
            return Err(ParseError::TooLarge { size });
        }
        // Every read of a stored file parses it too: the exact form is counted only when
        // its bound (each byte escaped as `\u00XX`) does not already fit.
        if file.api_form_bound() > MAX_API_FORM_BYTES {
            let size = file.api_form_len();
            if size > MAX_API_FORM_BYTES {
                return Err(ParseError::ApiFormTooLarge { size });
            }
        }
        Ok(file)
    }

    /// The length of the options as serde_json writes them in the API's unit entity (see
    /// [`MAX_API_FORM_BYTES`]), without building it.
    pub fn api_form_len(&self) -> usize {
        let text = |s: &str| -> usize {
            s.bytes()
                .map(|b| match b {
                    b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                    b if b < 0x20 => 6,
                    _ => 1,
                })
                .sum()
        };
        let options: usize = self
            .options
            .iter()
            .map(|o| API_FORM_PER_OPTION + text(&o.section) + text(&o.name) + text(&o.value))
            .sum();
        // The brackets, and a comma between options rather than after each.
        options + 2 - usize::from(!self.options.is_empty())
    }

    /// At least [`api_form_len`](Self::api_form_len), from the lengths alone.
    fn api_form_bound(&self) -> usize {
        let options: usize = self
            .options
            .iter()
            .map(|o| API_FORM_PER_OPTION + 6 * (o.section.len() + o.name.len() + o.value.len()))
            .sum();
        options + 2
    }

    /// The length of [`UnitFile::canonical`] without building it.
    fn canonical_len(&self) -> usize {
        let grouped = self.by_section();
        let headers: usize = grouped.iter().map(|(s, _)| s.len() + 3).sum();
        let lines: usize = self
            .options
            .iter()
            .map(|o| o.name.len() + o.value.len() + 2)
            .sum();
        headers + lines + grouped.len().saturating_sub(1)
    }

    /// Options grouped by section in order of first appearance; linear in the options.
    fn by_section(&self) -> Vec<(&str, Vec<&UnitOption>)> {
        let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut grouped: Vec<(&str, Vec<&UnitOption>)> = Vec::new();
        for o in self.options.iter() {
            let i = *index.entry(o.section.as_str()).or_insert_with(|| {
                grouped.push((o.section.as_str(), Vec::new()));
                grouped.len() - 1
            });
            grouped[i].1.push(o);
        }
        grouped
    }

    /// Builds a unit file from options (for instance ones read back from the registry).
    pub fn from_options(options: Vec<UnitOption>) -> UnitFile {
        UnitFile {
            options: options.into(),
        }
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
        let mut out = String::with_capacity(self.canonical_len());
        for (i, (section, options)) in self.by_section().into_iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push('[');
            out.push_str(section);
            out.push_str("]\n");
            for o in options {
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

/// fleet's serialization of options as read, in bytes: the text [`UnitFile::canonical`] writes.
fn serialize_raw(options: &[lexer::RawOption]) -> Vec<u8> {
    let mut index: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    let mut grouped: Vec<(&[u8], Vec<&lexer::RawOption>)> = Vec::new();
    for o in options {
        let i = *index.entry(&o.section).or_insert_with(|| {
            grouped.push((&o.section, Vec::new()));
            grouped.len() - 1
        });
        grouped[i].1.push(o);
    }
    let mut out = Vec::new();
    for (i, (section, options)) in grouped.into_iter().enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.push(b'[');
        out.extend_from_slice(section);
        out.extend_from_slice(b"]\n");
        for o in options {
            out.extend_from_slice(&o.name);
            out.push(b'=');
            out.extend_from_slice(&o.value);
            out.push(b'\n');
        }
    }
    out
}

/// `bytes` as go's JSON encoder writes a string: each byte of invalid UTF-8 becomes U+FFFD.
fn go_lossy(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(valid) => {
                out.push_str(valid);
                return out;
            }
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                let bad = e.error_len().unwrap_or(rest.len());
                out.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, bad));
                bytes = &rest[bad..];
            }
        }
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

/// Lower-case hex digits, by value.
const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for UnitHash {
    /// 40 lower-case hex digits, written at once: a listing of 100,000 states formats as many
    /// hashes, and 20 `write!`s each were 7 % of fleetd's time serving one (perf).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut hex = [0u8; 40];
        for (i, b) in self.0.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0xf)];
        }
        f.write_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"))
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
        // Lower-case digits only: the hash's one spelling (a key, a record's field).
        let digit = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 20];
        for (i, pair) in s.as_bytes().chunks_exact(2).enumerate() {
            let (Some(hi), Some(lo)) = (digit(pair[0]), digit(pair[1])) else {
                return Err(bad());
            };
            out[i] = hi << 4 | lo;
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

mod lexer;

#[cfg(test)]
mod tests;
