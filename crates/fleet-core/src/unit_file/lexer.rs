//! The reading of a unit file as fleet v1.0 reads it (go-systemd's unit deserializer), byte
//! for byte, so that a file fleet accepts gives the options fleet got and a file it refuses is
//! refused here too. It owns no policy: [`super::UnitFile::parse`] decides what to do with them.
//!
//! What fleet's reader does, and this one therefore does (checked against fleet's binaries, see
//! `tests/fleet_hashes/`):
//! - before the first `[`, every character is skipped except `#`/`;`, which skip to the end of
//!   the line: text before the first section is ignored, and a `[` in it opens a section;
//! - a section name runs to the next `]`, across lines if need be; only white space may follow;
//! - in a section, white space (newlines included) is skipped; `#`/`;` start a comment, which a
//!   `\` (one space allowed after it) continues onto the next line;
//! - a name runs to `=`; a newline (`\n` or `\r`) or the end of the file before it is an error;
//! - a value is the rest of the line; a line ending exactly in `\` continues it (joined with a
//!   newline, not at the end of the file); a blank line ends it; then it is trimmed, keeping a
//!   final newline if the last line joined was a blank one;
//! - only `\n` ends a line: a `\r` before it stays in the line, so a CRLF line ending in `\`
//!   does not continue (its `\r` is trimmed with the value's white space);
//! - the line length check looks, before each step of the reader, at the next 2048 bytes of a
//!   4096-byte read buffer, and only when at least 2048 bytes are buffered: it refuses when
//!   they hold neither `\n` nor `\r`. So which long lines are refused depends on where they
//!   fall in the buffer; [`Reader`] keeps the buffer's window to refuse exactly those.

use super::{MAX_LINE_BYTES, ParseError};

/// go's `bufio.Reader` default size: how far ahead the reader has read decides what it checks.
const BUFFER: usize = 4096;

/// One option as read, in bytes: fleet's reader keeps invalid UTF-8 and NUL bytes as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RawOption {
    pub section: Vec<u8>,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

/// A cursor over the file that also tracks the end of the read buffer fleet's reader would hold
/// (`end`): it refills to `pos + BUFFER` only when a read runs out of buffered bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    end: usize,
    last_width: usize,
    /// The first line end (`\n` or `\r`) at or after `.0` is at `.1` (or the file's end).
    line_end: (usize, usize),
}

/// A character as read: a valid one, or one byte of invalid UTF-8.
#[derive(Clone, Copy)]
enum Rune {
    Char(char),
    Invalid,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader {
            bytes,
            pos: 0,
            end: 0,
            last_width: 0,
            line_end: (0, 0),
        }
    }

    fn line_at(&self, pos: usize) -> usize {
        1 + self.bytes[..pos].iter().filter(|b| **b == b'\n').count()
    }

    /// The check fleet runs before every step: with a full window buffered, it must hold a line
    /// end.
    fn check_line_length(&mut self) -> Result<(), ParseError> {
        if self.end - self.pos < MAX_LINE_BYTES {
            return Ok(());
        }
        if self.next_line_end() < self.pos + MAX_LINE_BYTES {
            return Ok(());
        }
        Err(ParseError::LineTooLong {
            line: self.line_at(self.pos),
        })
    }

    /// Where the next `\n` or `\r` is, remembered: the check runs before every character of
    /// white space, and searching afresh each time would be quadratic.
    fn next_line_end(&mut self) -> usize {
        let (from, at) = self.line_end;
        if from > self.pos || at < self.pos {
            let found = self.bytes[self.pos..]
                .iter()
                .position(|b| matches!(b, b'\n' | b'\r'));
            self.line_end = (self.pos, found.map_or(self.bytes.len(), |i| self.pos + i));
        }
        self.line_end.1
    }

    fn refill(&mut self, from: usize) {
        self.end = (from + BUFFER).min(self.bytes.len());
    }

    fn read_rune(&mut self) -> Option<Rune> {
        if !full_rune(&self.bytes[self.pos..self.end]) && self.end < self.bytes.len() {
            self.refill(self.pos);
        }
        if self.pos == self.end {
            return None;
        }
        let (rune, width) = decode(&self.bytes[self.pos..self.end]);
        self.pos += width;
        self.last_width = width;
        Some(rune)
    }

    fn unread_rune(&mut self) {
        self.pos -= self.last_width;
        self.last_width = 0;
    }

    /// Reads through the next `delim` (or to the end of the file); returns the bytes read, the
    /// delimiter included, and whether it was found.
    fn read_through(&mut self, delim: u8) -> (&'a [u8], bool) {
        let start = self.pos;
        let found = self.bytes[start..]
            .iter()
            .position(|b| *b == delim)
            .map(|i| start + i);
        let mut from = start;
        loop {
            if let Some(at) = found.filter(|at| *at < self.end) {
                self.pos = at + 1;
                return (&self.bytes[start..=at], true);
            }
            if self.end == self.bytes.len() {
                self.pos = self.end;
                return (&self.bytes[start..], false);
            }
            // A full buffer without the delimiter is handed over whole and read afresh.
            if self.end - from == BUFFER {
                from = self.end;
            }
            self.refill(from);
        }
    }

    /// The rest of the line without its `\n` (a `\r` before it stays), and whether the file
    /// ended instead.
    fn read_line_rest(&mut self) -> (&'a [u8], bool) {
        let (line, found) = self.read_through(b'\n');
        if found {
            (&line[..line.len() - 1], false)
        } else {
            (line.strip_suffix(b"\r").unwrap_or(line), true)
        }
    }
}

/// Whether `p` starts with a whole character or with bytes that can only be invalid (go's
/// `utf8.FullRune`): the reader refills before reading a character only when this is false.
fn full_rune(p: &[u8]) -> bool {
    let Some(&lead) = p.first() else {
        return false;
    };
    let (needed, second) = match lead {
        0x00..=0x7f | 0x80..=0xc1 | 0xf5..=0xff => return true,
        0xc2..=0xdf => (2, 0x80..=0xbf),
        0xe0 => (3, 0xa0..=0xbf),
        0xed => (3, 0x80..=0x9f),
        0xe1..=0xef => (3, 0x80..=0xbf),
        0xf0 => (4, 0x90..=0xbf),
        0xf4 => (4, 0x80..=0x8f),
        0xf1..=0xf3 => (4, 0x80..=0xbf),
    };
    p.len() >= needed
        || p.get(1).is_some_and(|b| !second.contains(b))
        || p.get(2).is_some_and(|b| !(0x80..=0xbf).contains(b))
}

/// The first character of `p` and its width; an invalid byte reads as one byte wide.
fn decode(p: &[u8]) -> (Rune, usize) {
    let head = &p[..p.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or_default(),
    };
    match valid.chars().next() {
        Some(c) => (Rune::Char(c), c.len_utf8()),
        None => (Rune::Invalid, 1),
    }
}

/// `p` without leading and trailing white space (Unicode's, as go's `bytes.TrimSpace`);
/// invalid bytes are not space.
pub(super) fn trim_space(p: &[u8]) -> &[u8] {
    let is_space = |r: Rune| matches!(r, Rune::Char(c) if c.is_whitespace());
    let mut start = 0;
    while start < p.len() {
        let (rune, width) = decode(&p[start..]);
        if !is_space(rune) {
            break;
        }
        start += width;
    }
    let mut end = p.len();
    while end > start {
        // The last character starts at most three continuation bytes back; if what starts
        // there does not end at `end`, the last byte is invalid, hence not space.
        let back = p[start..end]
            .iter()
            .rev()
            .take(3)
            .take_while(|b| (0x80..=0xbf).contains(*b))
            .count();
        let at = end - 1 - back.min(end - 1 - start);
        let (rune, width) = decode(&p[at..end]);
        if at + width != end || !is_space(rune) {
            break;
        }
        end = at;
    }
    &p[start..end]
}

/// Where the reader is between two steps; each step is preceded by the line length check.
enum Step {
    /// Before the first section: anything but `[`, `#` and `;` is skipped, one character a step.
    Preamble,
    SectionName,
    SectionEnd(Vec<u8>),
    /// A comment, with where to go after it (`true`: into the current section).
    Comment {
        in_section: bool,
    },
    /// In a section, between options.
    Body,
    OptionName,
    Value {
        name: Vec<u8>,
        partial: Vec<u8>,
    },
}

/// Reads `bytes` into options, or refuses the file where fleet's reader does.
pub(super) fn read(bytes: &[u8]) -> Result<Vec<RawOption>, ParseError> {
    let mut reader = Reader::new(bytes);
    let mut options = Vec::new();
    let mut section: Vec<u8> = Vec::new();
    let mut step = Step::Preamble;
    loop {
        reader.check_line_length()?;
        step = match step {
            Step::Preamble => match reader.read_rune() {
                None => return Ok(options),
                Some(Rune::Char('[')) => Step::SectionName,
                Some(Rune::Char('#' | ';')) => Step::Comment { in_section: false },
                Some(_) => Step::Preamble,
            },
            Step::SectionName => section_name(&mut reader)?,
            Step::SectionEnd(name) => {
                let (rest, _) = reader.read_line_rest();
                if !trim_space(rest).is_empty() {
                    return Err(ParseError::GarbageAfterSection {
                        line: reader.line_at(reader.pos.saturating_sub(1)),
                        section: String::from_utf8_lossy(&name).into_owned(),
                    });
                }
                section = name;
                Step::Body
            }
            Step::Comment { in_section } => {
                skip_comment(&mut reader);
                if in_section {
                    Step::Body
                } else {
                    Step::Preamble
                }
            }
            Step::Body => match reader.read_rune() {
                None => return Ok(options),
                Some(Rune::Char(c)) if c.is_whitespace() => Step::Body,
                Some(Rune::Char('[')) => Step::SectionName,
                Some(Rune::Char('#' | ';')) => Step::Comment { in_section: true },
                Some(_) => {
                    reader.unread_rune();
                    Step::OptionName
                }
            },
            Step::OptionName => Step::Value {
                name: option_name(&mut reader)?,
                partial: Vec::new(),
            },
            Step::Value { name, mut partial } => {
                let (line, eof) = reader.read_line_rest();
                let blank = trim_space(line).is_empty();
                if !blank {
                    partial.extend_from_slice(line);
                }
                if blank || !line.ends_with(b"\\") {
                    options.push(RawOption {
                        section: section.clone(),
                        name,
                        value: finish_value(&partial),
                    });
                    Step::Body
                } else {
                    if !eof {
                        partial.push(b'\n');
                    }
                    Step::Value { name, partial }
                }
            }
        };
    }
}

fn section_name(reader: &mut Reader<'_>) -> Result<Step, ParseError> {
    let opened = reader.pos.saturating_sub(1);
    match reader.read_through(b']') {
        (name, true) => Ok(Step::SectionEnd(name[..name.len() - 1].to_vec())),
        (_, false) => Err(ParseError::UnterminatedSection {
            line: reader.line_at(opened),
        }),
    }
}

/// Skips a comment's line, and the next ones while a line ends in `\` (or `\ `).
fn skip_comment(reader: &mut Reader<'_>) {
    loop {
        let (line, _) = reader.read_line_rest();
        let line = line.strip_suffix(b" ").unwrap_or(line);
        if !line.ends_with(b"\\") {
            return;
        }
    }
}

/// A name, read one character at a time to its `=`; invalid bytes become U+FFFD, as go's
/// reader writes the characters it decoded.
fn option_name(reader: &mut Reader<'_>) -> Result<Vec<u8>, ParseError> {
    let start = reader.pos;
    let mut name = String::new();
    loop {
        let refused = |reader: &Reader<'_>| ParseError::NotAnAssignment {
            line: reader.line_at(start),
            text: String::from_utf8_lossy(trim_space(&reader.bytes[start..reader.pos]))
                .into_owned(),
        };
        match reader.read_rune() {
            None => return Err(refused(reader)),
            Some(Rune::Char('\n' | '\r')) => {
                reader.unread_rune();
                return Err(refused(reader));
            }
            Some(Rune::Char('=')) => break,
            Some(Rune::Char(c)) => name.push(c),
            Some(Rune::Invalid) => name.push(char::REPLACEMENT_CHARACTER),
        }
    }
    Ok(trim_space(name.as_bytes()).to_vec())
}

/// The value trimmed; a final newline (left by a continuation that met a blank line) is kept.
fn finish_value(partial: &[u8]) -> Vec<u8> {
    let mut value = trim_space(partial).to_vec();
    if partial.ends_with(b"\n") {
        value.push(b'\n');
    }
    value
}
