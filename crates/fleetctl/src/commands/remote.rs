//! `status` and `journal`: the unit's status and journal from the machine that runs it.
//!
//! Where that machine's fleetd serves its API over the network (it publishes the address,
//! `MachineInfo::api`), fleetctl asks that fleetd ([`crate::driver::unit_api`]): over `https://`
//! with the API driver's TLS files and client certificate, or plain `http://`. When the unit's
//! machine is this one (same `/etc/machine-id`), the API driver's unix socket is asked, or
//! with another driver systemctl and journalctl run here. No sshd is needed anywhere.
//!
//! Otherwise, and always with `--ssh`, fleet's way: `systemctl status` / `journalctl` run
//! directly when the machine is this one, else over ssh to the machine's public IP (`--tunnel`,
//! `--ssh-username`, `--ssh-port`, `--strict-host-key-checking`, `--known-hosts-file`,
//! `--ssh-timeout`). The ssh program is `ssh` unless `FLEETCTL_SSH_COMMAND` names another (as
//! `GIT_SSH` does for git).
//!
//! Exit status, as fleet's: `status` exits 0 when every unit is active, else 3 (systemctl's
//! "not active"), or what systemctl or ssh exited with. `journal -f` ends when fleetd ends the
//! stream or on Ctrl-C (SIGINT), which drops the connection and exits 0, as `journalctl -f`
//! does.

use anyhow::{Context, Result, bail};
use fleet_api_wire::wire::UnitStatus;
use fleet_core::{MachineId, MachineInfo, UnitName};
use fleet_ops::Cluster;
use fleet_registry::kv::TlsFiles;
use std::io::Write;
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::Command;

use super::Ctx;
use crate::cli::Global;
use crate::driver::unit_api::{JournalQuery, UnitApi};
use crate::driver::{self, Driver};

const MACHINE_ID_FILE: &str = "/etc/machine-id";

/// systemctl's exit status for a unit that is not active.
pub const NOT_ACTIVE: u8 = 3;

/// The command's exit status, decided by what it ran remotely (systemctl, ssh); what it ran
/// has already said why, so fleetctl prints nothing more.
#[derive(Debug, thiserror::Error)]
#[error("exit status {0}")]
pub struct Exit(pub u8);

/// Where a command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Local,
    Ssh { ip: String },
}

/// How fleetctl reaches a unit's machine for its status and journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Ask the fleetd at this API endpoint.
    Api(String),
    /// Run systemctl/journalctl there (here, or over ssh).
    Shell(Target),
}

/// What [`route`] knows about this side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Here {
    /// This machine's `/etc/machine-id`, if it has one.
    pub machine: Option<String>,
    /// The API driver's endpoint when it is a unix socket (this machine's fleetd).
    pub socket: Option<String>,
    /// `--ssh`: fleet's way only.
    pub ssh: bool,
    /// `--allow-http-remote`: a machine's published `http://` address is followed too.
    pub http_remote: bool,
}

impl Here {
    /// This process's side: its machine ID, the driver's socket, `--ssh`.
    pub fn of(global: &Global) -> Here {
        let chosen = driver::select(global.driver, global.endpoint.as_deref());
        let first = chosen.endpoint.split(',').next().unwrap_or("").trim();
        let socket = (chosen.driver == Driver::Api
            && (first.starts_with("unix://") || first.starts_with("file://")))
        .then(|| first.to_owned());
        Here {
            machine: std::fs::read_to_string(MACHINE_ID_FILE)
                .ok()
                .map(|s| s.trim().to_owned()),
            socket,
            ssh: global.ssh,
            http_remote: global.allow_http_remote,
        }
    }

    fn is(&self, machine: &MachineId) -> bool {
        self.machine.as_deref() == Some(machine.as_str())
    }
}

/// How to reach `machine`. This one: its fleetd through the API driver's socket, else
/// systemctl here (no network, no TLS files needed). Another: its fleetd at the address it
/// publishes, else over ssh. `--ssh` takes fleet's way only.
pub fn route(here: &Here, machine: &MachineId, info: Option<&MachineInfo>) -> Result<Route> {
    if here.is(machine) {
        return Ok(match &here.socket {
            Some(socket) if !here.ssh => Route::Api(socket.clone()),
            _ => Route::Shell(Target::Local),
        });
    }
    if !here.ssh
        && let Some(m) = info
        && !m.api.is_empty()
    {
        followed(&m.api, here.http_remote)
            .map_err(|why| anyhow::anyhow!("machine {machine} publishes the API address {:?}, which fleetctl does not follow: {why}", fleet_registry::input::shorten(&m.api)))?;
        return Ok(Route::Api(m.api.clone()));
    }
    match info {
        Some(m) if !m.public_ip.is_empty() => Ok(Route::Shell(Target::Ssh {
            ip: m.public_ip.clone(),
        })),
        Some(_) => bail!("machine {machine} has no public IP to reach it at"),
        None => bail!("machine {machine} is not in the cluster any more"),
    }
}

/// Why a machine's published API address is not followed, if it is not (issue 37): the
/// address is what that host says, so only `https://HOST:PORT` (checked against the API
/// driver's authority) by default, `http://HOST:PORT` with `--allow-http-remote`, and never
/// a unix socket, a path or credentials.
fn followed(url: &str, http_remote: bool) -> Result<(), String> {
    let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
    match scheme {
        "https" => {}
        "http" if http_remote => {}
        "http" => {
            return Err("plain http (use --ssh, or --allow-http-remote to follow it)".into());
        }
        _ => return Err(format!("a {scheme}:// address (only https:// is followed)")),
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let bad =
        |c: char| matches!(c, '/' | '?' | '#' | '@' | '\\') || c.is_control() || c.is_whitespace();
    if authority.is_empty() || authority.chars().any(bad) || !authority.contains(':') {
        return Err("not HOST:PORT".into());
    }
    Ok(())
}

/// The ssh argv up to and including the host: `ssh -p PORT -o ... -l USER -- IP`.
pub fn ssh_argv(global: &Global, port: u16, ip: &str, forward_agent: bool) -> Vec<String> {
    let ssh = std::env::var("FLEETCTL_SSH_COMMAND").unwrap_or_else(|_| "ssh".into());
    let mut argv = vec![ssh, "-p".into(), port.to_string()];
    let strict = if global.strict_host_key_checking {
        "yes"
    } else {
        "no"
    };
    argv.push("-o".into());
    argv.push(format!("StrictHostKeyChecking={strict}"));
    let known = shellexpand_home(&global.known_hosts_file);
    argv.push("-o".into());
    argv.push(format!("UserKnownHostsFile={known}"));
    argv.push("-o".into());
    argv.push(format!(
        "ConnectTimeout={}",
        global.ssh_timeout.ceil() as u64
    ));
    if !global.tunnel.is_empty() {
        let tunnel = if global.tunnel.contains(':') {
            global.tunnel.clone()
        } else {
            format!("{}:22", global.tunnel)
        };
        argv.push("-J".into());
        argv.push(format!("{}@{tunnel}", global.ssh_username));
    }
    if forward_agent {
        argv.push("-A".into());
    }
    // The user goes with `-l` and the host after `--`: neither can be read as an option,
    // whatever they hold (`cli::parse_ssh_username` refuses a leading `-` too). ssh reads no
    // options after the host once `--` ended them.
    argv.push("-l".into());
    argv.push(global.ssh_username.clone());
    argv.push("--".into());
    argv.push(ip.to_owned());
    argv
}

/// The argv that runs `command` on `target`.
pub fn command_line(
    global: &Global,
    port: u16,
    target: &Target,
    command: &[String],
) -> Vec<String> {
    match target {
        Target::Local => command.to_vec(),
        Target::Ssh { ip } => {
            let mut argv = ssh_argv(global, port, ip, false);
            // The remote shell joins its arguments: quote each one.
            argv.extend(command.iter().map(|a| shell_quote(a)));
            argv
        }
    }
}

fn shellexpand_home(path: &str) -> String {
    match (path.strip_prefix("~/"), std::env::var("HOME")) {
        (Some(rest), Ok(home)) => format!("{home}/{rest}"),
        _ => path.to_owned(),
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./-_".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `argv` with this process's standard streams.
pub async fn run(argv: &[String]) -> Result<ExitStatus> {
    let (program, args) = argv.split_first().expect("a command");
    Command::new(program)
        .args(args)
        .status()
        .await
        .with_context(|| format!("running {program}"))
}

/// A command's exit status as fleetctl's (killed by a signal: 128 + it, as shells say).
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        (None, None) => 1,
    }
}

/// The machines that run `name` (every one for a global unit), with their legends' data.
pub async fn machines_of<C: Cluster>(
    ctx: &Ctx<C>,
    name: &UnitName,
) -> Result<(bool, Vec<(MachineId, Option<MachineInfo>)>)> {
    let Some(unit) = ctx.cluster.unit(name).await? else {
        bail!("Unit {name} does not exist.");
    };
    if unit.status.machines.is_empty() {
        return Ok((unit.global, Vec::new()));
    }
    let mut known = super::machines_by_id(ctx.cluster.machines().await?.machines);
    let machines = unit
        .status
        .machines
        .into_iter()
        .map(|id| {
            let info = known.remove(&id);
            (id, info)
        })
        .collect();
    Ok((unit.global, machines))
}

/// How `status` and `journal` reach fleetds: the driver's TLS files and request timeout.
#[derive(Debug, Clone)]
pub struct Reach {
    pub tls: TlsFiles,
    pub timeout: Duration,
}

impl Reach {
    pub fn of(global: &Global) -> Reach {
        Reach {
            // The fleetds' authority, which may differ from etcd's (issue 38).
            tls: global.api_tls(),
            // In range: `cli::global::parse_seconds` took at most a day.
            timeout: Duration::from_secs_f64(global.request_timeout),
        }
    }

    fn api(&self, endpoint: &str) -> Result<UnitApi> {
        UnitApi::new(endpoint, &self.tls, self.timeout)
            .with_context(|| "Unable to reach the unit's fleetd".to_owned())
    }
}

/// Options of `fleetctl status`.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    pub port: u16,
    /// `--output json`: the UnitStatus documents (the API only).
    pub json: bool,
}

/// `fleetctl status UNIT...`
pub async fn status<C: Cluster>(
    ctx: &mut Ctx<C>,
    global: &Global,
    opts: &StatusOptions,
    args: &[String],
) -> Result<()> {
    let names = super::unit_names(args)?;
    let here = Here::of(global);
    let reach = Reach::of(global);
    let mut documents = Vec::new();
    let mut first_failure = None;
    for (i, name) in names.iter().enumerate() {
        if i > 0 && !opts.json {
            ctx.say("");
        }
        let (_, machines) = machines_of(ctx, name).await?;
        if machines.is_empty() {
            bail!("Unit {name} does not appear to be loaded.");
        }
        if !opts.json {
            super::events::print_last(ctx, name).await;
        }
        for (machine, info) in &machines {
            let code = match route(&here, machine, info.as_ref())? {
                Route::Api(endpoint) => {
                    let api = reach.api(&endpoint)?;
                    let doc = api.status(name).await.with_context(|| {
                        format!("Unable to get the status of {name} from {endpoint}")
                    })?;
                    let active = doc.properties.get("ActiveState").map(String::as_str);
                    let code = if active == Some("active") {
                        0
                    } else {
                        NOT_ACTIVE
                    };
                    if opts.json {
                        documents.push(doc);
                    } else {
                        print_text(ctx, &doc);
                    }
                    code
                }
                Route::Shell(target) => {
                    if opts.json {
                        bail!(
                            "status --output json needs the API of the unit's machine \
                             ({machine} publishes none, or --ssh was given)"
                        );
                    }
                    // `--`: the name is an argument, never an option (issue 37).
                    let cmd: Vec<String> = [
                        "systemctl",
                        "status",
                        "-l",
                        "--no-pager",
                        "--",
                        name.as_str(),
                    ]
                    .map(String::from)
                    .to_vec();
                    // systemctl writes to this process's stdout: ours must be out first.
                    if let Err(e) = ctx.out.flush() {
                        ctx.write_failed.get_or_insert(e);
                    }
                    exit_code(run(&command_line(global, opts.port, &target, &cmd)).await?)
                }
            };
            if code != 0 && first_failure.is_none() {
                first_failure = Some(code);
            }
        }
    }
    if opts.json {
        let json = match documents.as_slice() {
            [one] => serde_json::to_string_pretty(one),
            many => serde_json::to_string_pretty(many),
        }
        .context("encoding the status documents")?;
        ctx.say(json);
    }
    match first_failure {
        None => Ok(()),
        Some(code) => Err(Exit(code).into()),
    }
}

/// `text` as systemctl prints it, ending with one newline; on a terminal with its control
/// characters shown, not obeyed (`crate::terminal`).
fn print_text<C>(ctx: &mut Ctx<C>, doc: &UnitStatus) {
    if crate::terminal::stdout_is_terminal() {
        let shown = crate::terminal::neutralize(doc.text.as_bytes());
        ctx.print(&String::from_utf8_lossy(&shown));
    } else {
        ctx.print(&doc.text);
    }
    if !doc.text.ends_with('\n') {
        ctx.say("");
    }
}

/// Options of `fleetctl journal`.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    pub lines: u32,
    pub follow: bool,
    pub output: String,
    pub sudo: bool,
    pub port: u16,
}

/// `fleetctl journal UNIT`
pub async fn journal<C: Cluster>(
    ctx: &mut Ctx<C>,
    global: &Global,
    opts: &JournalOptions,
    args: &[String],
) -> Result<()> {
    let [arg] = args else {
        bail!("One unit file must be provided.");
    };
    let name = UnitName::from_arg(arg)?;
    let (is_global, machines) = machines_of(ctx, &name).await?;
    if is_global {
        bail!("Unable to retrieve journal of global unit {name}.");
    }
    let Some((machine, info)) = machines.first() else {
        bail!("Unit {name} does not appear to be running.");
    };
    match route(&Here::of(global), machine, info.as_ref())? {
        Route::Api(endpoint) => {
            journal_over_api(ctx, &Reach::of(global), &endpoint, &name, opts).await
        }
        Route::Shell(target) => {
            let mut cmd: Vec<String> = Vec::new();
            if opts.sudo {
                cmd.push("sudo".into());
            }
            cmd.extend(
                [
                    "journalctl",
                    &format!("--unit={name}"),
                    "--no-pager",
                    "-n",
                    &opts.lines.to_string(),
                    "--output",
                    &opts.output,
                ]
                .map(String::from),
            );
            if opts.follow {
                cmd.push("-f".into());
            }
            match exit_code(run(&command_line(global, opts.port, &target, &cmd)).await?) {
                0 => Ok(()),
                code => Err(Exit(code).into()),
            }
        }
    }
}

/// Copies the journal fleetd streams to standard output as it arrives, until fleetd ends it
/// or, following, until Ctrl-C.
async fn journal_over_api<C: Cluster>(
    ctx: &mut Ctx<C>,
    reach: &Reach,
    endpoint: &str,
    name: &UnitName,
    opts: &JournalOptions,
) -> Result<()> {
    if !crate::driver::unit_api::known_output(&opts.output) {
        bail!(
            "unknown journal output mode {:?} (expected one of: {})",
            fleet_registry::input::shorten(&opts.output),
            fleet_api_wire::wire::JOURNAL_OUTPUTS.join(", ")
        );
    }
    let query = JournalQuery {
        lines: opts.lines,
        follow: opts.follow,
        output: opts.output.clone(),
    };
    let failed = || format!("Unable to get the journal of {name} from {endpoint}");
    let mut stream = reach
        .api(endpoint)?
        .journal(name, &query)
        .await
        .with_context(failed)?;
    let terminal = crate::terminal::stdout_is_terminal();
    let copy = async {
        while let Some(chunk) = stream.next_chunk().await? {
            let shown = if terminal {
                crate::terminal::neutralize(&chunk)
            } else {
                std::borrow::Cow::Borrowed(chunk.as_ref())
            };
            let written = ctx.out.write_all(&shown).and_then(|()| ctx.out.flush());
            if let Err(e) = written {
                // The exit code comes from the failed write (`Ctx::finish`).
                ctx.write_failed.get_or_insert(e);
                break;
            }
        }
        Ok::<_, fleet_ops::OpsError>(())
    };
    tokio::select! {
        copied = copy => copied.with_context(failed),
        // Dropping the stream closes the connection: fleetd stops following.
        _ = tokio::signal::ctrl_c(), if opts.follow => Ok(()),
    }
}

#[cfg(test)]
mod tests;
