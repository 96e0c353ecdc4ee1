//! fleetd's command line: `--config`, `--version`, `--set key=value`, and one flag per
//! configuration key (`--agent-ttl 3s` sets `agent_ttl`; each also read from
//! `FLEET_<KEY>`, declared in `config::KEYS`), which override the file; and the hidden
//! `--generate` of `make install` (`generate.rs`).

use clap::Parser;
use std::path::PathBuf;

use crate::config::Given;

#[derive(Debug, Parser)]
#[command(
    name = "fleetd",
    about = "fleet daemon: agent and engine on every host",
    disable_version_flag = true
)]
pub struct Cli {
    /// Path to the configuration file (default /etc/fleet/fleet.conf, if present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the version and exit.
    #[arg(long, short = 'v', alias = "version")]
    pub print_version: bool,
    /// A configuration key as `key=value` (repeatable, over every other layer), e.g.
    /// `--set agent_ttl=3s`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// The configuration keys, as flags and environment variables.
    #[command(flatten)]
    pub given: Given,
    /// Print a file `make install` ships (the sample configuration, the man page, a shell
    /// completion), generated from these definitions, and exit.
    #[arg(long, value_name = "WHAT", hide = true)]
    pub generate: Option<crate::generate::What>,
    /// Run the fence now and exit: stop the non-global units of this fleet units directory
    /// (the fence timer's service runs this when fleetd did not push it forward).
    #[arg(long, value_name = "UNITS_DIR", hide = true)]
    pub fence: Option<PathBuf>,
    /// `fleetd version` is accepted as in fleet.
    #[arg(hide = true)]
    pub positional: Vec<String>,
}
