//! What `make install` puts next to the binary, generated from fleetd's own definitions so
//! that none of it can drift from the flags and keys fleetd takes: the commented sample
//! configuration (from [`config::KEYS`](crate::config::KEYS)), the man page and the shell
//! completions (from [`Cli`]). A hidden `--generate WHAT` prints one of them to stdout; it
//! reads no configuration and talks to nothing.

use clap::CommandFactory;
use std::io::Write;

use crate::cli::Cli;

/// What `fleetd --generate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum What {
    /// `/etc/fleet/fleet.conf.sample`: every key, its meaning and its default.
    SampleConfig,
    /// `fleetd.8`, the man page (section 8: a system daemon).
    Man,
    Bash,
    Zsh,
    Fish,
}

/// Writes `what` to `out`.
pub fn write(what: What, out: &mut dyn Write) -> std::io::Result<()> {
    let shell = match what {
        What::SampleConfig => return out.write_all(crate::config::sample().as_bytes()),
        What::Man => {
            let cmd = Cli::command();
            return clap_mangen::Man::new(cmd)
                .title("fleetd")
                .section("8")
                .source(concat!("fleetd ", env!("CARGO_PKG_VERSION")))
                .render(out);
        }
        What::Bash => clap_complete::Shell::Bash,
        What::Zsh => clap_complete::Shell::Zsh,
        What::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut Cli::command(), "fleetd", out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(what: What) -> String {
        let mut out = Vec::new();
        write(what, &mut out).expect("written");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn every_shell_completes_the_configuration_flags() {
        for shell in [What::Bash, What::Zsh, What::Fish] {
            let script = text(shell);
            for flag in ["agent-ttl", "etcd-servers", "config"] {
                assert!(script.contains(flag), "{shell:?} script lacks {flag}");
            }
        }
    }

    #[test]
    fn the_man_page_is_in_section_8_and_documents_the_keys_but_not_generate() {
        let page = text(What::Man);
        assert!(page.contains(".TH fleetd 8"), "{page}");
        assert!(page.contains(env!("CARGO_PKG_VERSION")), "{page}");
        assert!(page.contains("etcd\\-servers"), "{page}");
        assert!(page.contains("agent\\-ttl"), "{page}");
        assert!(!page.contains("generate"), "{page}");
    }
}
