//! Running host commands (`ip`, `nsenter`, `kill`, ...) with errors that say what was run and
//! what it printed. The harness shells out on purpose: the same command lines work by hand
//! when debugging a machine, and they are what the README tells people to type.

use anyhow::{Context, Result, bail};
use std::ffi::OsStr;
use std::fmt;
use std::process::{Command, Output, Stdio};

/// Runs `program args...`, capturing its output; fails only if it cannot be started.
pub fn output<I, S>(program: &str, args: I) -> Result<Output>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    command
        .output()
        .with_context(|| format!("cannot run {}", describe(&command)))
}

/// Runs `program args...` and fails unless it exits 0; returns its stdout.
pub fn run<I, S>(program: &str, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(program);
    command.args(args).stdin(Stdio::null());
    let shown = describe(&command);
    command
        .output()
        .with_context(|| format!("cannot run {shown}"))?
        .checked()
        .with_context(|| shown)
}

/// The command line, for error messages.
pub fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Turning a finished command's [`Output`] into a result.
pub trait OutputExt {
    /// Stdout as text if the command exited 0, else an error carrying its status and stderr.
    fn checked(self) -> Result<String>;
    /// Stdout as text, whatever the exit status.
    fn stdout_text(&self) -> String;
}

impl OutputExt for Output {
    fn checked(self) -> Result<String> {
        if !self.status.success() {
            bail!(
                "exited with {}: {}{}",
                self.status,
                String::from_utf8_lossy(&self.stderr).trim(),
                if self.stdout.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (stdout: {})",
                        String::from_utf8_lossy(&self.stdout).trim()
                    )
                }
            );
        }
        Ok(self.stdout_text())
    }

    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

/// The signals tests send to processes (fleetd, mostly). A closed set so that a test cannot
/// misspell one and silently send nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Hup,
    Int,
    Kill,
    Term,
    Usr1,
    Usr2,
    Stop,
    Cont,
}

impl Signal {
    /// The name `kill -s` and `systemctl kill --signal` accept.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Hup => "SIGHUP",
            Signal::Int => "SIGINT",
            Signal::Kill => "SIGKILL",
            Signal::Term => "SIGTERM",
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Stop => "SIGSTOP",
            Signal::Cont => "SIGCONT",
        }
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
