//! fleetctl's command line, with fleet's commands, flags and `FLEETCTL_<FLAG>` environment
//! defaults. Unlike fleet, short flags such as `-l` work and every error exits non-zero.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueHint};

mod global;
pub use global::{Global, MAX_SECONDS, MIN_SECONDS};

#[derive(Debug, Parser)]
#[command(
    name = "fleetctl",
    about = "fleetctl -- a command line interface to a fleet cluster (Rust re-implementation)",
    disable_version_flag = true,
    infer_subcommands = true
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What a command's help says instead of listing the global flags again.
pub const GLOBALS_NOTE: &str = "Global options (--endpoint, --driver, --ca-file, ...) are taken \
    here too; `fleetctl --help` lists them.";

/// fleetctl's command line as it parses and prints help. Every command takes the global
/// flags, but only `fleetctl --help` lists them (issue 38: each command's help repeated all
/// of them, ~40 lines, after its own). Each command gets a hidden copy of every global flag
/// before clap propagates them (clap skips an argument a command already has), so they parse
/// there as before; completion scripts are made from [`Cli::command`], where they show.
pub fn command() -> clap::Command {
    let cmd = Cli::command();
    let globals: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    hide_globals(cmd, &globals)
}

fn hide_globals(cmd: clap::Command, globals: &[clap::Arg]) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    names.iter().fold(cmd, |cmd, name| {
        cmd.mut_subcommand(name, |sub| {
            let sub = globals
                .iter()
                .fold(sub, |sub, a| sub.arg(a.clone().hide(true)));
            hide_globals(sub.after_help(GLOBALS_NOTE), globals)
        })
    })
}

/// Parses the process's arguments with [`command`]; exits with clap's message and status on
/// a bad one, as `Cli::parse` does.
pub fn parse() -> Cli {
    let mut cmd = command();
    let matches = cmd.get_matches_mut();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut cmd).exit())
}

impl Command {
    /// The unit arguments of a command that acts on many units, where `{N..M}` ranges are
    /// expanded ([`crate::ranges`]).
    pub fn many_units_mut(&mut self) -> Option<&mut Vec<String>> {
        match self {
            Command::Submit(a) => Some(&mut a.units),
            Command::Load(a) | Command::Start(a) => Some(&mut a.units),
            Command::Stop(a) | Command::Unload(a) | Command::Restart(a) => Some(&mut a.units),
            Command::Destroy(a) => Some(&mut a.units),
            _ => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Upload one or more units to the cluster without starting them.
    Submit(Submit),
    /// Schedule one or more units in the cluster, first submitting them if necessary.
    Load(Activate),
    /// Instruct systemd to start one or more units in the cluster, first submitting and loading
    /// if necessary.
    Start(Activate),
    /// Instruct systemd to stop one or more units in the cluster.
    Stop(Blocking),
    /// Unschedule one or more units in the cluster.
    Unload(Blocking),
    /// Restart one or more units in the cluster (every machine of a global unit).
    Restart(Blocking),
    /// Output the unit's status (`systemctl status`) from the machine running it, asked of
    /// that machine's fleetd (or over ssh with --ssh, or where it publishes no API).
    Status(StatusArgs),
    /// Print the journal of a unit from the machine running it, streamed by that machine's
    /// fleetd (or over ssh with --ssh, or where it publishes no API).
    Journal(JournalArgs),
    /// Open a shell, or run COMMAND, over ssh on a machine (its ID or a unique prefix) or on
    /// the machine running a unit.
    Ssh(SshArgs),
    /// Output the contents of a submitted unit.
    Cat(Cat),
    /// List the units that exist in the cluster.
    ListUnitFiles(ListUnitFiles),
    /// List the current state of units in the cluster.
    ListUnits(ListUnits),
    /// Enumerate the current hosts in the cluster.
    ListMachines(ListMachines),
    /// Destroy one or more units in the cluster.
    Destroy(Units),
    /// Mark a machine unschedulable and move its non-global units off it, waiting until
    /// they run elsewhere.
    Drain(DrainArgs),
    /// Make a drained machine schedulable again (no unit moves back by itself).
    Undrain(MachineArg),
    /// Set a machine's metadata (`key=value`, over its configured metadata); the scheduler
    /// acts on it at once.
    SetMetadata(SetMetadataArgs),
    /// Remove metadata that set-metadata set on a machine.
    UnsetMetadata(UnsetMetadataArgs),
    /// Say why a unit runs where it does, or why it runs nowhere, machine by machine.
    Explain(ExplainArgs),
    /// Print what happened to units and machines: users' actions, the engine's decisions and
    /// what systemd did, oldest first (docs/operating.md, "What happened to my unit").
    Events(EventsArgs),
    /// Create and list fleet's etcd roles and users (as etcd's root user, --driver=etcd only).
    #[command(subcommand)]
    Auth(AuthCommand),
    /// Take over a live fleet v1 cluster: copy its units, desired states and placement from
    /// its etcd v2 registry into ours, so that our fleetds adopt the running units
    /// (docs/migrating.md; over the API, as an admin).
    ImportFleet(ImportFleetArgs),
    /// Print where the web dashboard is (every fleetd serves it under /ui/ on its API, with
    /// the API's roles).
    Ui,
    /// Print fleetctl's version and the versions the cluster's fleetds publish (fleetctl's
    /// alone, with a warning, when the cluster cannot be reached).
    Version(VersionArgs),
    /// Print a shell completion script (`source <(fleetctl completion bash)`).
    Completion(CompletionArgs),
    /// Write fleetctl's man pages (fleetctl.1 and one per command) into a directory.
    #[command(hide = true)]
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Output format: text, or json (one document; docs/operating.md, "JSON output").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: crate::completion::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    pub dir: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct Submit {
    /// Replace the unit in the registry if its content differs from the local file.
    #[arg(long)]
    pub replace: bool,
    /// Units: paths to unit files (a file's name is its unit's: hello.service), or names of
    /// instances to make from a template (web@1 from web@.service here or in the cluster).
    #[arg(value_name = "UNIT", value_hint = ValueHint::FilePath)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct BlockFlags {
    /// Do not wait until the units reach their state before exiting.
    #[arg(long)]
    pub no_block: bool,
    /// Wait this many attempts (2 s each) for the units to reach their state; 0 waits forever.
    #[arg(long, default_value_t = 0)]
    pub block_attempts: u32,
}

#[derive(Debug, Args)]
pub struct Activate {
    /// Replace the unit in the registry if its content differs from the local file.
    #[arg(long)]
    pub replace: bool,
    /// With --replace: put the new file in place and reload systemd, but leave running units
    /// running; the new version takes effect at their next restart.
    #[arg(long, requires = "replace", conflicts_with = "reschedule")]
    pub no_restart: bool,
    /// With --replace: place the unit afresh (preferably on another machine) instead of
    /// keeping it where it runs.
    #[arg(long, requires = "replace")]
    pub reschedule: bool,
    /// With --replace: replace N machines of a global unit (or N units of the list) at a time,
    /// waiting for each to be active, stopping at the first failure.
    #[arg(
        long,
        requires = "replace",
        value_name = "N",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "1",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub rolling: Option<u32>,
    #[command(flatten)]
    pub block: BlockFlags,
    /// Units: names (hello.service; hello is hello.service; web@1 an instance of web@.service,
    /// web@{1..3} three of them) or paths to unit files, whose name is the unit's.
    #[arg(value_name = "UNIT", value_hint = ValueHint::FilePath)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct Blocking {
    #[command(flatten)]
    pub block: BlockFlags,
    /// Units in the cluster: names such as hello.service, hello (a .service) or web@1, and
    /// ranges such as web@{1..3}.
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// SSH port of the machines (with --ssh, or where a machine publishes no API).
    #[arg(long, default_value_t = 22)]
    pub ssh_port: u16,
    /// Output format: text (systemctl's), or json (the UnitStatus document of each unit's
    /// machine; an array when there are several). json needs the machines' API.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Units whose status to print (hello.service, or hello for it).
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SshArgs {
    /// Forward the local ssh-agent to the machine.
    #[arg(short = 'A', long)]
    pub forward_agent: bool,
    /// The machine: its ID or a unique prefix of a live machine's ID.
    #[arg(long, value_name = "MACHINE", conflicts_with = "unit")]
    pub machine: Option<String>,
    /// The unit whose machine to open the connection to.
    #[arg(long, value_name = "UNIT")]
    pub unit: Option<String>,
    /// SSH port of the machines.
    #[arg(long, default_value_t = 22)]
    pub ssh_port: u16,
    /// MACHINE|UNIT (unless --machine or --unit is given), then the COMMAND to run there
    /// (a shell when none; words after `--` are taken as they are).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "MACHINE|UNIT [COMMAND]"
    )]
    pub args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct JournalArgs {
    /// Number of recent log lines to print.
    #[arg(long, default_value_t = 10)]
    pub lines: u32,
    /// Keep printing new entries as they arrive.
    #[arg(short = 'f', long, alias = "f")]
    pub follow: bool,
    /// journalctl output mode (short, verbose, json, cat...).
    #[arg(long, default_value = "short")]
    pub output: String,
    /// Run journalctl with sudo.
    #[arg(long)]
    pub sudo: bool,
    /// SSH port of the machines.
    #[arg(long, default_value_t = 22)]
    pub ssh_port: u16,
    /// The unit whose journal to print (hello.service, or hello for it).
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct Units {
    /// Units to remove from the cluster (stopped and unloaded first): names such as
    /// hello.service, hello (a .service) or web@1, and ranges such as web@{1..3}.
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub units: Vec<String>,
}

#[derive(Debug, Args)]
pub struct Cat {
    /// Units whose file to print (hello.service, or hello for it).
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub units: Vec<String>,
}

/// Options common to every listing.
#[derive(Debug, Args)]
pub struct Listing {
    /// Do not print the header line (no effect with --output=json).
    #[arg(long)]
    pub no_legend: bool,
    /// Do not shorten machine IDs and hashes (JSON always has them in full).
    #[arg(short = 'l', long, alias = "l")]
    pub full: bool,
    /// Output format: text (fleet's table), or json (one document of the API's full-view
    /// entities; --fields is refused with it). docs/operating.md, "JSON output".
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Print the listing, then again, after an empty line, each time it changes, until
    /// Ctrl-C. Changes come from etcd's watch or fleetd's change stream: nothing polls. A
    /// lost stream is reconnected, with a note on stderr.
    #[arg(long, short = 'w')]
    pub watch: bool,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// After the events so far, print each new one as it happens, until Ctrl-C.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only the events of this unit.
    #[arg(long)]
    pub unit: Option<String>,
    /// Only the events about this machine (its full ID): placed on or moved from it, what its
    /// agent saw, its drains and metadata.
    #[arg(long)]
    pub machine: Option<String>,
    /// Only the events of the last DURATION: a number and a unit, s, m, h or d (`10m`).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<std::time::Duration>,
    /// Output format: text (a table), or json (the API's event entities: one document, or
    /// one entity a line with --follow).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output: Format,
    /// Print no header line.
    #[arg(long)]
    pub no_legend: bool,
}

fn parse_since(s: &str) -> Result<std::time::Duration, String> {
    fleet_api_wire::events::parse_since(s)
        .ok_or_else(|| format!("{s:?} is no duration (a number and a unit: 90s, 10m, 2h, 1d)"))
}

/// How a listing or `version` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ListUnitFiles {
    #[command(flatten)]
    pub listing: Listing,
    /// Columns to print, comma-separated, from: desc, dstate, global, hash, reason, state,
    /// target, unit (`reason`: why the engine cannot place the unit yet).
    /// [default: unit,hash,dstate,state,target]
    #[arg(long)]
    pub fields: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListUnits {
    #[command(flatten)]
    pub listing: Listing,
    /// Columns to print, comma-separated, from: active, exit, hash, load, machine, pending,
    /// restarts, since, sub, unit (`pending` says `restart` where the running process predates
    /// its unit file; `restarts`: restarts after failing on its machine, by systemd's
    /// `Restart=` or by fleet; `since`: time in its current state; `exit`: how its main
    /// process last ended). [default: unit,machine,active,sub]
    #[arg(long)]
    pub fields: Option<String>,
}

#[derive(Debug, Args)]
pub struct ListMachines {
    #[command(flatten)]
    pub listing: Listing,
    /// Columns to print, comma-separated, from: drained, ip, leader, machine, metadata
    /// (`drained`: how many moves at a time, or `-`; `leader`: `yes` on the machine whose
    /// engine leads, else `-`). [default: machine,ip,metadata]
    #[arg(long)]
    pub fields: Option<String>,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// How many moved units may be on their way (not yet active elsewhere) at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub parallel: u32,
    /// Exit 0 even if some units cannot leave the machine (they are named either way).
    #[arg(long)]
    pub force: bool,
    /// Return once the machine is marked, without waiting for its units to move.
    #[arg(long)]
    pub no_block: bool,
    /// Wait this many attempts (2 s each) for the units to move; 0 waits forever.
    #[arg(long, default_value_t = 0)]
    pub block_attempts: u32,
    /// The machine: its ID or a unique prefix of a live machine's ID.
    pub machine: String,
}

#[derive(Debug, Args)]
pub struct MachineArg {
    /// The machine: its ID or a unique prefix of a live machine's ID.
    pub machine: String,
}

#[derive(Debug, Args)]
pub struct SetMetadataArgs {
    /// The machine: its ID or a unique prefix of a live machine's ID.
    pub machine: String,
    /// `key=value` pairs (key: letters, digits, `_`, `.`, `-`; value: no whitespace or `=`).
    #[arg(value_name = "KEY=VALUE")]
    pub pairs: Vec<String>,
}

#[derive(Debug, Args)]
pub struct UnsetMetadataArgs {
    /// The machine: its ID or a unique prefix of a live machine's ID.
    pub machine: String,
    /// The keys to remove.
    #[arg(value_name = "KEY")]
    pub keys: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Output format: text, or json (one document, the API's `GET /explain/<unit>`).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// The unit to explain (hello.service, or hello for it).
    #[arg(value_name = "UNIT", value_hint = ValueHint::Other)]
    pub unit: String,
}

/// `fleetctl auth ...`: etcd's RBAC for fleet (docs/security.md, "Setting it up").
#[derive(Debug, Subcommand)]
pub enum AuthCommand {
    /// Create the roles fleet-viewer, fleet-operator and fleet-engine for --etcd-key-prefix,
    /// the users asked for, and (with --enable) the root user, then turn etcd's auth on.
    Setup(AuthSetup),
    /// Issue a machine its own etcd user, fleet-host-MACHINE, with role fleet-machine-MACHINE
    /// (and fleet-engine with --engine, and a role for its API with --api).
    AddHost(AuthAddHost),
    /// Remove a machine's user and role.
    RemoveHost(AuthRemoveHost),
    /// List etcd's users and their roles.
    List,
}

#[derive(Debug, Args)]
pub struct AuthSetup {
    /// Create the user root (password from --root-password-file) and turn etcd's auth on.
    #[arg(long, requires = "root_password_file")]
    pub enable: bool,
    /// File whose first line is the root user's password.
    #[arg(long, value_name = "FILE", requires = "enable")]
    pub root_password_file: Option<std::path::PathBuf>,
    /// Create (or update) an operator user of this name, with role fleet-operator.
    #[arg(long, value_name = "NAME", requires = "operator_password_file")]
    pub operator: Option<String>,
    /// File whose first line is the operator's password.
    #[arg(long, value_name = "FILE", requires = "operator")]
    pub operator_password_file: Option<std::path::PathBuf>,
    /// Create (or update) a read-only user of this name, with role fleet-viewer.
    #[arg(long, value_name = "NAME", requires = "viewer_password_file")]
    pub viewer: Option<String>,
    /// File whose first line is the viewer's password.
    #[arg(long, value_name = "FILE", requires = "viewer")]
    pub viewer_password_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct AuthAddHost {
    /// The machine's ID (its /etc/machine-id).
    pub machine: String,
    /// File whose first line is the host user's password (give fleetd the same file as
    /// etcd_password_file). Not --password-file: that one is root's, to run this as.
    #[arg(long, value_name = "FILE")]
    pub host_password_file: std::path::PathBuf,
    /// The host runs an engine (disable_engine unset): it may write schedules and lead.
    #[arg(long)]
    pub engine: bool,
    /// What the host's API may do in etcd for its clients: read, write (and read), or none.
    #[arg(long, value_enum, default_value_t = ApiAccess::None)]
    pub api: ApiAccess,
}

/// `--api` of `auth add-host`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiAccess {
    None,
    Read,
    Write,
}

#[derive(Debug, Args)]
pub struct AuthRemoveHost {
    /// The machine's ID.
    pub machine: String,
}

#[cfg(test)]
mod tests;

#[derive(Debug, Args)]
pub struct ImportFleetArgs {
    /// fleet v1's etcd: its client URLs (etcd's v2 API; etcd 3.x needs --enable-v2).
    #[arg(long, value_name = "URL[,URL...]")]
    pub from: String,
    /// fleet's key prefix in that etcd (fleet's etcd_key_prefix).
    #[arg(long, value_name = "PREFIX", default_value = "/_coreos.com/fleet/")]
    pub from_prefix: String,
    /// CA file of fleet's etcd's TLS certificate (https:// URLs).
    #[arg(long, value_name = "FILE")]
    pub from_ca_file: Option<std::path::PathBuf>,
    /// Client certificate for fleet's etcd.
    #[arg(long, value_name = "FILE", requires = "from_key_file")]
    pub from_cert_file: Option<std::path::PathBuf>,
    /// Key of --from-cert-file.
    #[arg(long, value_name = "FILE", requires = "from_cert_file")]
    pub from_key_file: Option<std::path::PathBuf>,
    /// User of fleet's etcd (its v2 auth), with --from-password-file.
    #[arg(long, value_name = "NAME", requires = "from_password_file")]
    pub from_username: Option<String>,
    /// File whose first line is --from-username's password.
    #[arg(long, value_name = "FILE", requires = "from_username")]
    pub from_password_file: Option<std::path::PathBuf>,
    /// Print what would be imported, and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Take fleet's file for a unit ours has with another file.
    #[arg(long)]
    pub replace: bool,
}
