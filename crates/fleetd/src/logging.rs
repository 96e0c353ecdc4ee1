//! Where fleetd's log goes and in which shape, chosen once at startup from `log_format`,
//! `log_filter` (else `RUST_LOG`, else `verbosity`) and what stderr is.
//!
//! Under systemd, stderr is a journal stream (`JOURNAL_STREAM` names its device and inode):
//! there fleetd writes to journald natively ([`journal`]), so that levels become priorities
//! (`journalctl -p warning`), fields become journal fields, and no colour codes or second
//! timestamp end up in `MESSAGE`. Elsewhere it writes text lines to stderr, coloured only on
//! a terminal, or JSON lines when asked. The choice itself is [`choose`], pure.

mod journal;

use std::io::IsTerminal;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The `log_format` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// The journal when stderr is a journal stream, else text.
    #[default]
    Auto,
    Text,
    Json,
    Journal,
}

impl FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "journal" => Ok(Self::Journal),
            _ => Err("expected auto, text, json or journal".to_owned()),
        }
    }
}

/// What stderr is, as far as the choice goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stderr {
    /// stderr is the stream `JOURNAL_STREAM` names.
    pub journal: bool,
    pub terminal: bool,
}

/// Where log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Journal,
    Text { ansi: bool },
    Json,
}

/// The output for `format` given what stderr is. Colour only ever goes to a terminal.
pub fn choose(format: LogFormat, stderr: Stderr) -> Output {
    match format {
        LogFormat::Auto if stderr.journal => Output::Journal,
        LogFormat::Journal => Output::Journal,
        LogFormat::Auto | LogFormat::Text => Output::Text {
            ansi: stderr.terminal,
        },
        LogFormat::Json => Output::Json,
    }
}

/// The filter: `log_filter` if given, else `RUST_LOG` if set, else `verbosity` (above 0:
/// fleet's own crates at debug; the libraries under them stay at info).
pub fn filter_directives(
    log_filter: Option<&str>,
    rust_log: Option<&str>,
    verbosity: u8,
) -> String {
    match (log_filter, rust_log) {
        (Some(f), _) => f.to_owned(),
        (None, Some(env)) if !env.trim().is_empty() => env.to_owned(),
        _ if verbosity > 0 => "info,fleetd=debug,fleet_=debug".to_owned(),
        _ => "info".to_owned(),
    }
}

/// Checks a `log_filter` value as `EnvFilter` would read it.
pub fn check_filter(directives: &str) -> Result<(), String> {
    EnvFilter::try_new(directives)
        .map(drop)
        .map_err(|e| format!("not a RUST_LOG-style filter: {e}"))
}

/// Whether `journal_stream` (`JOURNAL_STREAM`, `<device>:<inode>`) names the file whose
/// device and inode are `dev` and `ino`: a child that inherited the variable but not the
/// stream (its stderr is a pipe) is not writing to the journal.
pub fn is_journal_stream(journal_stream: Option<&str>, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.and_then(|s| s.split_once(':')) else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// What to put before a line written to stderr before (or besides) the subscriber: `<3>`,
/// the error priority, when stderr is the journal (journald reads the prefix, as
/// `SyslogLevelPrefix=` says), so that `journalctl -p err` finds a bad configuration.
pub fn stderr_error_prefix() -> &'static str {
    match stderr_kind().journal {
        true => "<3>",
        false => "",
    }
}

fn stderr_kind() -> Stderr {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let stderr = std::io::stderr();
    let journal = stderr
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata())
        .is_ok_and(|m| {
            let stream = std::env::var("JOURNAL_STREAM").ok();
            is_journal_stream(stream.as_deref(), m.dev(), m.ino())
        });
    Stderr {
        journal,
        terminal: stderr.is_terminal(),
    }
}

/// Installs the global subscriber. Returns the output in use, and why the journal could not
/// be used when it was chosen (then text goes to stderr instead).
pub fn init(format: LogFormat, directives: &str) -> (Output, Option<std::io::Error>) {
    let mut output = choose(format, stderr_kind());
    let mut fallback = None;
    let journal = match output {
        Output::Journal => match journal::Layer::connect() {
            Ok(layer) => Some(layer),
            Err(e) => {
                fallback = Some(e);
                output = Output::Text { ansi: false };
                None
            }
        },
        Output::Text { .. } | Output::Json => None,
    };
    // Checked when the configuration was built; RUST_LOG was not, and a bad one means info.
    let filter = EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let text = match output {
        Output::Text { ansi } => Some(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(std::io::stderr),
        ),
        Output::Journal | Output::Json => None,
    };
    let json = (output == Output::Json).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .with_writer(std::io::stderr)
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(journal)
        .with(text)
        .with(json)
        .init();
    (output, fallback)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOURNAL: Stderr = Stderr {
        journal: true,
        terminal: false,
    };
    const TERMINAL: Stderr = Stderr {
        journal: false,
        terminal: true,
    };
    const PIPE: Stderr = Stderr {
        journal: false,
        terminal: false,
    };

    #[test]
    fn logs_natively_to_the_journal_only_when_stderr_is_its_stream() {
        assert_eq!(choose(LogFormat::Auto, JOURNAL), Output::Journal);
        assert_eq!(
            choose(LogFormat::Auto, TERMINAL),
            Output::Text { ansi: true }
        );
        assert_eq!(choose(LogFormat::Auto, PIPE), Output::Text { ansi: false });
    }

    #[test]
    fn an_explicit_format_wins_and_colour_needs_a_terminal() {
        assert_eq!(
            choose(LogFormat::Text, JOURNAL),
            Output::Text { ansi: false }
        );
        assert_eq!(choose(LogFormat::Json, TERMINAL), Output::Json);
        assert_eq!(choose(LogFormat::Journal, PIPE), Output::Journal);
    }

    #[test]
    fn journal_stream_must_name_stderrs_own_device_and_inode() {
        assert!(is_journal_stream(Some("8:12345"), 8, 12345));
        assert!(!is_journal_stream(Some("8:12345"), 8, 99));
        assert!(!is_journal_stream(Some("9:12345"), 8, 12345));
        assert!(!is_journal_stream(Some("garbage"), 8, 12345));
        assert!(!is_journal_stream(None, 8, 12345));
    }

    #[test]
    fn log_filter_wins_over_rust_log_which_wins_over_verbosity() {
        assert_eq!(
            filter_directives(Some("fleet_engine=trace"), Some("debug"), 1),
            "fleet_engine=trace"
        );
        assert_eq!(filter_directives(None, Some("warn"), 1), "warn");
        assert_eq!(filter_directives(None, Some(" "), 0), "info");
        assert_eq!(filter_directives(None, None, 0), "info");
        assert_eq!(
            filter_directives(None, None, 2),
            "info,fleetd=debug,fleet_=debug"
        );
    }

    /// The targets of the events `directives` let through, of those emitted.
    fn passed(directives: &str) -> Vec<String> {
        use std::sync::{Arc, Mutex};
        #[derive(Debug, Clone, Default)]
        struct Targets(Arc<Mutex<Vec<String>>>);
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Targets {
            fn on_event(
                &self,
                event: &tracing::Event<'_>,
                _: tracing_subscriber::layer::Context<'_, S>,
            ) {
                let target = event.metadata().target().to_owned();
                self.0.lock().unwrap().push(target);
            }
        }
        let seen = Targets::default();
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new(directives))
            .with(seen.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!(target: "fleet_agent::executor", "ours");
            tracing::debug!(target: "fleetd", "ours");
            tracing::debug!(target: "h2::codec", "theirs");
            tracing::info!(target: "hyper::client", "theirs");
        });
        seen.0.lock().unwrap().clone()
    }

    #[test]
    fn verbosity_debugs_our_crates_but_not_the_libraries_under_them() {
        assert_eq!(
            passed(&filter_directives(None, None, 1)),
            ["fleet_agent::executor", "fleetd", "hyper::client"]
        );
        assert_eq!(passed(&filter_directives(None, None, 0)), ["hyper::client"]);
    }

    #[test]
    fn a_bad_filter_is_refused_with_the_reason() {
        assert!(check_filter("info,fleet_agent=debug").is_ok());
        let e = check_filter("fleet_agent=loud").unwrap_err();
        assert!(e.contains("RUST_LOG-style"), "{e}");
    }

    #[test]
    fn log_formats_parse_from_their_names() {
        assert_eq!("json".parse(), Ok(LogFormat::Json));
        assert_eq!("journal".parse(), Ok(LogFormat::Journal));
        assert!("xml".parse::<LogFormat>().is_err());
    }
}
