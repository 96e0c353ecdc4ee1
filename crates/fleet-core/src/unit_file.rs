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

/// systemd's `LINE_MAX`: a physical line, its newline included, must fit in this many bytes,
/// so its text is at most 2047 bytes. go-systemd refuses longer lines rather than let systemd
/// truncate them silently.
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
    #[error("line {line}: found garbage after section name {section:?}")]
    GarbageAfterSection { line: usize, section: String },
    #[error("line {line}: option {name:?} outside of any section")]
    OutsideSection { line: usize, name: String },
    #[error("line {line}: expected Name=Value, found {text:?}")]
    NotAnAssignment { line: usize, text: String },
    #[error("line {line}: value ends in a backslash that continues nothing")]
    DanglingBackslash { line: usize },
    #[error("line {line}: empty option name")]
    EmptyName { line: usize },
    #[error("line {line}: NUL byte in unit file")]
    Nul { line: usize },
    #[error("unit file has no options")]
    Empty,
}

/// The UTF-8 byte order mark, which systemd skips at the start of a unit file.
const BOM: &[u8] = b"\xEF\xBB\xBF";

impl UnitFile {
    /// Parses a unit file as go-systemd does: sections, `Name=Value`, `#`/`;` comments, blank
    /// lines, backslash continuations (kept in the value as `\` + newline), repeated keys in
    /// order, repeated `[Section]` headers merged. Unlike go-systemd it refuses text before the
    /// first section, non-UTF-8 bytes, NUL bytes (systemd would end the line there) and empty
    /// files, and it honours continuations in CRLF files. A leading UTF-8 byte order mark is
    /// skipped, as systemd does; it is not part of the canonical text, so the hash is the
    /// one of the same file without it.
    pub fn parse(bytes: &[u8]) -> Result<UnitFile, ParseError> {
        if bytes.len() > MAX_UNIT_FILE_BYTES {
            return Err(ParseError::TooLarge { size: bytes.len() });
        }
        let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
        if let Some(at) = bytes.iter().position(|b| *b == 0) {
            let line = 1 + bytes[..at].iter().filter(|b| **b == b'\n').count();
            return Err(ParseError::Nul { line });
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ParseError::NotUtf8 {
            line: 1 + bytes[..e.valid_up_to()]
                .iter()
                .filter(|b| **b == b'\n')
                .count(),
        })?;
        let mut lines = Lines::new(text);
        let mut options = Vec::new();
        let mut section: Option<String> = None;
        while let Some((line_no, raw)) = lines.next_line()? {
            // Leading space is insignificant; trailing space is not (it ends a continuation).
            let line = raw.trim_start();
            if line.is_empty() {
                continue;
            }
            if line.starts_with(['#', ';']) {
                skip_comment(line, &mut lines)?;
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                section = Some(section_name(rest, line_no)?);
                continue;
            }
            let Some((name, first)) = line.split_once('=') else {
                return Err(ParseError::NotAnAssignment {
                    line: line_no,
                    text: line.trim_end().to_owned(),
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
            options.push(UnitOption {
                section: section.clone(),
                name: name.to_owned(),
                value: read_value(first, line_no, &mut lines)?,
            });
        }
        if options.is_empty() {
            return Err(ParseError::Empty);
        }
        let file = UnitFile {
            options: options.into(),
        };
        // The registry stores the canonical text, which can be longer than the file as
        // written (headers repeated per merged section): that is what must fit.
        let size = file.canonical_len();
        if size > MAX_UNIT_FILE_BYTES {
            return Err(ParseError::TooLarge { size });
        }
        Ok(file)
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

/// Physical lines with their 1-based numbers, line ends (`\n` or `\r\n`) removed, each
/// checked against [`MAX_LINE_BYTES`].
struct Lines<'a> {
    inner: std::iter::Enumerate<std::str::Split<'a, char>>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Lines {
            inner: text.split('\n').enumerate(),
        }
    }

    fn next_line(&mut self) -> Result<Option<(usize, &'a str)>, ParseError> {
        let Some((idx, raw)) = self.inner.next() else {
            return Ok(None);
        };
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.len() >= MAX_LINE_BYTES {
            return Err(ParseError::LineTooLong { line: idx + 1 });
        }
        Ok(Some((idx + 1, line)))
    }
}

/// `rest` is a header line after its `[`: the name runs to the first `]`, and only space may
/// follow.
fn section_name(rest: &str, line: usize) -> Result<String, ParseError> {
    let Some((name, after)) = rest.split_once(']') else {
        return Err(ParseError::UnterminatedSection { line });
    };
    if !after.trim().is_empty() {
        return Err(ParseError::GarbageAfterSection {
            line,
            section: name.to_owned(),
        });
    }
    Ok(name.to_owned())
}

/// go-systemd lets a comment continue onto the next line when it ends in `\` (one trailing
/// space allowed), so the continued line is a comment too and must not become an option.
fn skip_comment<'a>(mut line: &'a str, lines: &mut Lines<'a>) -> Result<(), ParseError> {
    while line.strip_suffix(' ').unwrap_or(line).ends_with('\\') {
        match lines.next_line()? {
            Some((_, next)) => line = next,
            None => break,
        }
    }
    Ok(())
}

/// Reads a value whose first line is `first` (everything after `=`). A line ending exactly in
/// `\` continues onto the next, joined with a newline; a blank continuation line ends the value
/// and, as in go-systemd, leaves that newline at its end. The value is then trimmed.
///
/// The end of the file ends a continuation as a blank line does, so `A=x\` as the last line
/// reads the same with or without a final newline (the value is `x\` + newline; that form
/// was the one accepted first, and its hash must not change).
///
/// go-systemd accepts a value that still ends in `\` (`A=x\ ` with a trailing space), but its
/// canonical text reads back as a continuation and systemd joins it with the next line: such
/// a value is refused.
fn read_value<'a>(
    first: &'a str,
    line_no: usize,
    lines: &mut Lines<'a>,
) -> Result<String, ParseError> {
    let mut value = first.to_owned();
    let (mut last, mut last_no) = (first, line_no);
    let mut ends_in_newline = false;
    while last.ends_with('\\') {
        let Some((next_no, next)) = lines.next_line()? else {
            ends_in_newline = true;
            break;
        };
        value.push('\n');
        if next.trim().is_empty() {
            ends_in_newline = true;
            break;
        }
        value.push_str(next);
        (last, last_no) = (next, next_no);
    }
    let mut value = value.trim().to_owned();
    if ends_in_newline {
        value.push('\n');
    } else if value.ends_with('\\') {
        return Err(ParseError::DanglingBackslash { line: last_no });
    }
    Ok(value)
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

#[cfg(test)]
mod tests;
