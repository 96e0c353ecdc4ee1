//! `status` and `journal`: run `systemctl status` / `journalctl` for a unit on the machine that
//! runs it: directly when that machine is this one (same `/etc/machine-id`), otherwise over
//! ssh to the machine's public IP, like fleet (`--tunnel`, `--ssh-username`, `--ssh-port`,
//! `--strict-host-key-checking`, `--known-hosts-file`, `--ssh-timeout`). The ssh program is
//! `ssh` unless `FLEETCTL_SSH_COMMAND` names another (as `GIT_SSH` does for git).

use anyhow::{Context, Result, bail};
use fleet_core::{MachineId, MachineInfo, UnitName};
use fleet_ops::Cluster;
use std::process::ExitStatus;
use tokio::process::Command;

use super::Ctx;
use crate::cli::Global;

const MACHINE_ID_FILE: &str = "/etc/machine-id";

/// Where a command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Local,
    Ssh { ip: String },
}

fn local_machine() -> Option<String> {
    std::fs::read_to_string(MACHINE_ID_FILE)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn target_of(machine: &MachineId, info: Option<&MachineInfo>) -> Result<Target> {
    if local_machine().as_deref() == Some(machine.as_str()) {
        return Ok(Target::Local);
    }
    match info {
        Some(m) if !m.public_ip.is_empty() => Ok(Target::Ssh {
            ip: m.public_ip.clone(),
        }),
        Some(_) => bail!("machine {machine} has no public IP to reach it at"),
        None => bail!("machine {machine} is not in the cluster any more"),
    }
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
            // The user goes with `-l` and the host after `--`: neither can be read as an
            // option, whatever they hold (`cli::parse_ssh_username` refuses a leading `-`
            // too). ssh reads no options after the host once `--` ended them.
            argv.push("-l".into());
            argv.push(global.ssh_username.clone());
            argv.push("--".into());
            argv.push(ip.clone());
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

async fn run(argv: &[String]) -> Result<ExitStatus> {
    let (program, args) = argv.split_first().expect("a command");
    Command::new(program)
        .args(args)
        .status()
        .await
        .with_context(|| format!("running {program}"))
}

/// The machines that run `name` (every one for a global unit), with their legends' data.
async fn machines_of<C: Cluster>(
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

/// `fleetctl status UNIT...`
pub async fn status<C: Cluster>(
    ctx: &mut Ctx<C>,
    global: &Global,
    port: u16,
    args: &[String],
) -> Result<()> {
    let names = super::unit_names(args)?;
    let mut first_failure = None;
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            ctx.say("");
        }
        let (_, machines) = machines_of(ctx, name).await?;
        if machines.is_empty() {
            bail!("Unit {name} does not appear to be loaded.");
        }
        for (machine, info) in &machines {
            let target = target_of(machine, info.as_ref())?;
            let cmd: Vec<String> = ["systemctl", "status", "-l", "--no-pager", name.as_str()]
                .map(String::from)
                .to_vec();
            let status = run(&command_line(global, port, &target, &cmd)).await?;
            if !status.success() && first_failure.is_none() {
                first_failure = Some(status.code().unwrap_or(1));
            }
        }
    }
    match first_failure {
        None => Ok(()),
        Some(code) => bail!("systemctl status exited with code {code}"),
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
    let target = target_of(machine, info.as_ref())?;
    let mut cmd: Vec<String> = Vec::new();
    if opts.sudo {
        cmd.push("sudo".into());
    }
    cmd.extend(
        [
            "journalctl",
            "--unit",
            name.as_str(),
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
    let status = run(&command_line(global, opts.port, &target, &cmd)).await?;
    if !status.success() {
        bail!("journalctl exited with code {}", status.code().unwrap_or(1));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn global(args: &[&str]) -> Global {
        let mut argv = vec!["fleetctl"];
        argv.extend_from_slice(args);
        argv.push("version");
        crate::cli::Cli::parse_from(argv).global
    }

    #[test]
    fn runs_locally_without_ssh() {
        let cmd = vec!["systemctl".to_string(), "status".into()];
        assert_eq!(command_line(&global(&[]), 22, &Target::Local, &cmd), cmd);
    }

    #[test]
    fn builds_fleets_ssh_command_line_with_tunnel_and_quoting() {
        let g = global(&[
            "--tunnel",
            "bastion",
            "--ssh-username",
            "admin",
            "--strict-host-key-checking=false",
            "--known-hosts-file",
            "/k",
        ]);
        let cmd = vec![
            "systemctl".to_string(),
            "status".into(),
            "a b.service".into(),
        ];
        let argv = command_line(
            &g,
            2222,
            &Target::Ssh {
                ip: "10.0.0.2".into(),
            },
            &cmd,
        );
        assert_eq!(argv[1..3], ["-p".to_string(), "2222".into()]);
        assert!(argv.contains(&"StrictHostKeyChecking=no".to_string()));
        assert!(argv.contains(&"UserKnownHostsFile=/k".to_string()));
        assert!(argv.contains(&"admin@bastion:22".to_string()));
        let host = argv.iter().position(|a| a == "10.0.0.2").unwrap();
        assert_eq!(
            argv[host - 3..host],
            ["-l", "admin", "--"].map(String::from)
        );
        assert_eq!(argv.last().unwrap(), "'a b.service'");
    }

    #[test]
    fn refuses_ssh_user_names_and_tunnels_that_would_be_options() {
        for args in [
            &["--ssh-username=-oProxyCommand=touch /tmp/x"][..],
            &["--ssh-username", "a@b"],
            &["--ssh-username", ""],
            &["--tunnel=-oProxyCommand=x"],
            &["--ssh-timeout", "1e20"],
            &["--ssh-timeout", "0.0000001"],
            &["--request-timeout", "1e19"],
        ] {
            let mut argv = vec!["fleetctl"];
            argv.extend_from_slice(args);
            argv.push("version");
            assert!(crate::cli::Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }
}
