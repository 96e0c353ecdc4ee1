//! A `tracing` layer that writes to journald's native socket, one datagram per event.
//!
//! Each entry has `PRIORITY` from the level (error 3, warn 4, info 6, debug and trace 7),
//! `MESSAGE` as an operator reads it (`journalctl -u fleet`, `-o cat`): the event's message
//! followed by `key=value` for its fields and its spans' fields, never colour codes or a
//! timestamp (journald keeps its own), and each field again as a journal field of its own
//! (`unit` is `UNIT=`, `journalctl -u fleet UNIT=web.service`). A field whose name journald
//! or this layer already uses (`MESSAGE`, `PRIORITY`, `CODE_FILE`, ...) becomes
//! `FLEET_<NAME>`.
//!
//! Unlike the `tracing-journald` crate, whose `MESSAGE` is the bare message ("task failed",
//! without the unit), the text of an entry stands on its own. Entries are kept below the
//! datagram size journald accepts without a memfd: long values are cut. A failed send goes
//! to stderr, which under systemd is the journal's stream too.

use std::fmt::{self, Write as _};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// journald's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";
/// The longest value kept, in bytes; a datagram stays well under journald's limits.
const MAX_VALUE: usize = 16 * 1024;
/// Names this layer writes itself, or journald gives a meaning: a field of that name is
/// written as `FLEET_<NAME>` instead.
const RESERVED: &[&str] = &[
    "MESSAGE",
    "MESSAGE_ID",
    "PRIORITY",
    "CODE_FILE",
    "CODE_LINE",
    "CODE_FUNC",
    "ERRNO",
    "SYSLOG_IDENTIFIER",
    "SYSLOG_FACILITY",
    "SYSLOG_PID",
    "SYSLOG_TIMESTAMP",
    "TARGET",
    "INVOCATION_ID",
    "DOCUMENTATION",
    "TID",
];

/// The journald layer.
#[derive(Debug)]
pub struct Layer {
    socket: UnixDatagram,
    path: PathBuf,
    identifier: String,
}

impl Layer {
    /// A layer sending to journald's socket; fails when there is no journald to send to.
    pub fn connect() -> std::io::Result<Layer> {
        Self::to(Path::new(SOCKET))
    }

    /// A layer sending to the datagram socket at `path`.
    pub fn to(path: &Path) -> std::io::Result<Layer> {
        // Probed once with a connect (nothing is sent): with no journald at all, fleetd falls
        // back to stderr at startup. Entries are sent to the path each time, not on the
        // connected socket, so that a restarted journald gets them too.
        UnixDatagram::unbound()?.connect(path)?;
        let socket = UnixDatagram::unbound()?;
        Ok(Layer {
            socket,
            path: path.to_owned(),
            identifier: "fleetd".to_owned(),
        })
    }
}

/// A span's fields, kept in its extensions as they will be written.
#[derive(Debug, Default)]
struct SpanFields(Vec<(&'static str, String)>);

impl<S> tracing_subscriber::Layer<S> for Layer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        span.extensions_mut().insert(SpanFields(fields.fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        values.record(&mut fields);
        let mut ext = span.extensions_mut();
        match ext.get_mut::<SpanFields>() {
            Some(known) => known.0.extend(fields.fields),
            None => ext.insert(SpanFields(fields.fields)),
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        // Innermost span first: its fields are the most specific (a task's unit).
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(known) = span.extensions().get::<SpanFields>() {
                    for (name, value) in &known.0 {
                        if !fields.fields.iter().any(|(n, _)| n == name) {
                            fields.fields.push((name, value.clone()));
                        }
                    }
                }
            }
        }
        let meta = event.metadata();
        let entry = Entry {
            priority: priority(*meta.level()),
            message: &fields.message,
            fields: &fields.fields,
            target: meta.target(),
            file: meta.file(),
            line: meta.line(),
            identifier: &self.identifier,
        };
        let datagram = entry.encode();
        if self.socket.send_to(&datagram, &self.path).is_err() {
            eprintln!("{}", entry.text());
        }
    }
}

/// syslog's priority of a level.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// An event's message and fields, as text.
#[derive(Debug, Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, format!("{value:?}"));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => self.message = value,
            name => self.fields.push((name, value)),
        }
    }
}

/// One journal entry before encoding.
#[derive(Debug)]
struct Entry<'a> {
    priority: u8,
    message: &'a str,
    fields: &'a [(&'static str, String)],
    target: &'a str,
    file: Option<&'a str>,
    line: Option<u32>,
    identifier: &'a str,
}

impl Entry<'_> {
    /// `MESSAGE`: the message, then ` key=value` per field (quoted when it has spaces).
    fn text(&self) -> String {
        let mut text = self.message.to_owned();
        for (name, value) in self.fields {
            let quote = value.is_empty() || value.contains(char::is_whitespace);
            let _ = match quote {
                true => write!(text, " {name}={value:?}"),
                false => write!(text, " {name}={value}"),
            };
        }
        text
    }

    /// journald's native protocol: `KEY=value\n`, or for a value with a newline
    /// `KEY\n<length as u64 LE><value>\n`.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        put(&mut out, "PRIORITY", &self.priority.to_string());
        put(&mut out, "SYSLOG_IDENTIFIER", self.identifier);
        put(&mut out, "MESSAGE", &self.text());
        put(&mut out, "TARGET", self.target);
        if let Some(file) = self.file {
            put(&mut out, "CODE_FILE", file);
        }
        if let Some(line) = self.line {
            put(&mut out, "CODE_LINE", &line.to_string());
        }
        for (name, value) in self.fields {
            put(&mut out, &field_name(name), value);
        }
        out
    }
}

/// A tracing field's journal name: upper case, `[A-Z0-9_]`, not starting with `_` or a
/// digit, and `FLEET_`-prefixed when journald or this layer already uses the name.
fn field_name(name: &str) -> String {
    let mut key: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' => c.to_ascii_uppercase(),
            'A'..='Z' | '0'..='9' => c,
            _ => '_',
        })
        .collect();
    let leading = key.trim_start_matches('_').len();
    key = key.split_off(key.len() - leading);
    if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) || RESERVED.contains(&&*key)
    {
        key.insert_str(0, "FLEET_");
    }
    key
}

fn put(out: &mut Vec<u8>, key: &str, value: &str) {
    let value = cut(value);
    out.extend_from_slice(key.as_bytes());
    if value.contains('\n') {
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        out.push(b'=');
    }
    out.extend_from_slice(value.as_bytes());
    out.push(b'\n');
}

/// `value`, cut to [`MAX_VALUE`] bytes at a character boundary.
fn cut(value: &str) -> &str {
    if value.len() <= MAX_VALUE {
        return value;
    }
    let mut end = MAX_VALUE;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tracing::{info_span, warn};
    use tracing_subscriber::layer::SubscriberExt;

    /// Decodes one datagram of the native protocol.
    fn decode(mut d: &[u8]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        while !d.is_empty() {
            let end = d.iter().position(|b| *b == b'\n' || *b == b'=').unwrap();
            let key = String::from_utf8(d[..end].to_vec()).unwrap();
            let value;
            if d[end] == b'=' {
                let nl = d[end..].iter().position(|b| *b == b'\n').unwrap() + end;
                value = d[end + 1..nl].to_vec();
                d = &d[nl + 1..];
            } else {
                let len = u64::from_le_bytes(d[end + 1..end + 9].try_into().unwrap()) as usize;
                value = d[end + 9..end + 9 + len].to_vec();
                d = &d[end + 9 + len + 1..];
            }
            out.insert(key, String::from_utf8(value).unwrap());
        }
        out
    }

    #[test]
    fn a_warning_is_priority_4_with_its_fields_in_the_message_and_as_journal_fields() {
        let dir = std::env::temp_dir().join(format!("fleetd-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("socket");
        let _ = std::fs::remove_file(&path);
        let journald = UnixDatagram::bind(&path).unwrap();
        let layer = Layer::to(&path).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let span = info_span!("task", unit = "web.service", kind = "start");
            let _in = span.enter();
            warn!(error = "start job ended failed", "task failed");
        });
        let mut buf = vec![0u8; 65536];
        let n = journald.recv(&mut buf).unwrap();
        let entry = decode(&buf[..n]);
        assert_eq!(entry["PRIORITY"], "4");
        assert_eq!(entry["SYSLOG_IDENTIFIER"], "fleetd");
        assert_eq!(
            entry["MESSAGE"],
            "task failed error=\"start job ended failed\" unit=web.service kind=start"
        );
        assert_eq!(entry["UNIT"], "web.service");
        assert_eq!(entry["KIND"], "start");
        assert_eq!(entry["ERROR"], "start job ended failed");
        assert!(!entry["MESSAGE"].contains('\u{1b}'));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn there_is_no_layer_without_a_journald() {
        let path = std::env::temp_dir().join("fleetd-no-journald-here");
        assert!(Layer::to(&path).is_err());
    }

    #[test]
    fn values_with_newlines_are_length_prefixed() {
        let mut out = Vec::new();
        put(&mut out, "ERROR", "two\nlines");
        put(&mut out, "UNIT", "a.service");
        let entry = decode(&out);
        assert_eq!(entry["ERROR"], "two\nlines");
        assert_eq!(entry["UNIT"], "a.service");
    }

    #[test]
    fn field_names_become_valid_journal_names_that_never_clash() {
        assert_eq!(field_name("unit"), "UNIT");
        assert_eq!(field_name("retry_in"), "RETRY_IN");
        assert_eq!(field_name("_x.y"), "X_Y");
        assert_eq!(field_name("priority"), "FLEET_PRIORITY");
        assert_eq!(field_name("target"), "FLEET_TARGET");
        assert_eq!(field_name("1st"), "FLEET_1ST");
        assert_eq!(field_name("_"), "FLEET_");
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::WARN), 4);
        assert_eq!(priority(Level::INFO), 6);
        assert_eq!(priority(Level::DEBUG), 7);
        assert_eq!(priority(Level::TRACE), 7);
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_VALUE);
        let kept = cut(&long);
        assert!(kept.len() <= MAX_VALUE && kept.len() > MAX_VALUE - 2);
        assert_eq!(cut("short"), "short");
    }
}
