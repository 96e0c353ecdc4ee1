//! Shell completion scripts and man pages, both generated from the command line's own
//! definition ([`crate::cli::Cli`]), so they cannot drift from the flags fleetctl takes.
//! Neither talks to a cluster while it is made; the scripts ask it for unit names and
//! machine IDs as they complete ([`names`]).

mod names;

use clap::CommandFactory;
use std::io::Write;
use std::path::Path;

use crate::cli::Cli;

/// The shells fleetctl completes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Writes the completion script for `shell` to `out`. clap_complete panics when its own
/// write fails (`fleetctl completion bash | head -1`, issue 38), so the script is made in
/// memory and written here, a closed pipe an error like any other.
pub fn write_completion(shell: Shell, out: &mut dyn Write) -> std::io::Result<()> {
    let mut cmd = Cli::command();
    let generator = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(generator, &mut cmd, "fleetctl", &mut script);
    let script = String::from_utf8(script).map_err(std::io::Error::other)?;
    let script = match shell {
        Shell::Bash => script + &names::bash(&cmd),
        // clap's zsh script unchanged if its shape is not the one names::zsh knows: commands
        // and flags still complete (a unit test fails first).
        Shell::Zsh => names::zsh(&cmd, &script).unwrap_or(script),
        Shell::Fish => script + &names::fish(&cmd),
    };
    out.write_all(script.as_bytes())
}

/// Writes `fleetctl.1` and `fleetctl-<command>.1` for every visible command into `dir`;
/// returns the files written. The pages are those of `--help` ([`crate::cli::command`]): a
/// command's page leaves the global flags to fleetctl.1. Built first, so that each command
/// knows its full name: a page's synopsis reads `fleetctl start ...`, not `start ...`.
pub fn write_man_pages(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut cmd = crate::cli::command();
    cmd.build();
    let mut written = Vec::new();
    let mut page = |name: String, cmd: clap::Command| -> std::io::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd).title(name).render(&mut buf)?;
        std::fs::write(&path, buf)?;
        written.push(path);
        Ok(())
    };
    page("fleetctl".into(), cmd.clone())?;
    // Not clap's `help` command, which building added: `fleetctl help X` is X's page.
    let pages = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help");
    for sub in pages {
        let name = format!("fleetctl-{}", sub.get_name());
        page(name, sub.clone())?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_gets_a_script_that_names_the_commands() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            write_completion(shell, &mut out).unwrap();
            let text = String::from_utf8(out).expect("utf-8");
            for word in ["list-units", "list-unit-files", "block-attempts"] {
                assert!(text.contains(word), "{shell:?} script lacks {word}");
            }
        }
    }

    /// The zsh script wraps clap's function: if clap's output changes shape, this fails
    /// before users lose the names.
    #[test]
    fn the_zsh_script_wraps_clap_s_function_under_the_name_zsh_calls() {
        let mut out = Vec::new();
        write_completion(Shell::Zsh, &mut out).unwrap();
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text.matches("\n_fleetctl_clap() {\n").count(), 1);
        assert_eq!(text.matches("\n_fleetctl() {\n").count(), 1);
        let wrapper = text.find("\n_fleetctl() {\n").unwrap();
        let register = text
            .rfind("if [ \"$funcstack[1]\" = \"_fleetctl\" ]")
            .unwrap();
        assert!(
            wrapper < register,
            "the wrapper must be defined before it is registered"
        );
        for placeholder in ["@GLOBAL", "@VALUED@", "@UNITS@", "@MACHINES@"] {
            assert!(!text.contains(placeholder), "{placeholder} left");
        }
    }

    /// Issue 38, item 7: a reader that goes away is an error to return, not a panic.
    #[test]
    fn a_closed_pipe_is_an_error_not_a_panic() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let e = write_completion(Shell::Bash, &mut Closed).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn man_pages_cover_every_visible_command_and_not_the_hidden_one() {
        let dir = std::env::temp_dir().join(format!("fleetctl-man-{}", std::process::id()));
        let written = write_man_pages(&dir).expect("pages written");
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(names.contains(&"fleetctl.1".to_owned()));
        assert!(names.contains(&"fleetctl-start.1".to_owned()));
        assert!(!names.iter().any(|n| n == "fleetctl-man.1"));
        assert!(!names.iter().any(|n| n == "fleetctl-help.1"), "{names:?}");
        let start = std::fs::read_to_string(dir.join("fleetctl-start.1")).unwrap();
        assert!(start.contains("replace"), "{start}");
        // Issue 38: the synopsis is the command as typed, and the global flags are left to
        // fleetctl.1.
        assert!(
            start.contains(".SH SYNOPSIS\n\\fBfleetctl start\\fR"),
            "{start}"
        );
        assert!(!start.contains("\\fB\\-\\-endpoint\\fR"), "{start}");
        let top = std::fs::read_to_string(dir.join("fleetctl.1")).unwrap();
        assert!(top.contains("\\fB\\-\\-endpoint\\fR"), "{top}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
