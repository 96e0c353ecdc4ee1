//! `fleetctl ssh [-A] [--machine M | --unit U] MACHINE|UNIT [COMMAND...]`, as fleet's: ssh to
//! a machine (its ID or a unique prefix) or to the machine running a (non-global) unit, for a
//! shell or to run COMMAND there (its words joined by spaces, for the remote shell to read,
//! as fleet does). A bare argument that names both a machine and a unit is refused as
//! ambiguous. The ssh flags of `status` and `journal` apply (`--tunnel`, `--ssh-username`,
//! `--ssh-port`, `--strict-host-key-checking`, `--known-hosts-file`, `FLEETCTL_SSH_COMMAND`).
//! fleetctl exits with ssh's exit status (the remote command's).

use anyhow::{Result, bail};
use fleet_core::{MachineInfo, UnitName};
use fleet_ops::Cluster;

use super::Ctx;
use super::remote::{self, Exit};
use crate::cli::Global;

/// What the user asked to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Machine(String),
    Unit(String),
    /// Either: the first argument.
    Either(String),
}

/// The lookup and the command's words from the flags and arguments (fleet drops everything
/// up to a `--`, if one is left among them).
pub fn parse(
    machine: Option<String>,
    unit: Option<String>,
    mut args: Vec<String>,
) -> Result<(Lookup, Vec<String>)> {
    let lookup = match (machine, unit) {
        (Some(_), Some(_)) => {
            bail!("Both machine and unit flags provided, please specify only one.")
        }
        (Some(m), None) => Lookup::Machine(m),
        (None, Some(u)) => Lookup::Unit(u),
        (None, None) => {
            if args.is_empty() {
                bail!("Unable to proceed: one machine or unit must be provided");
            }
            Lookup::Either(args.remove(0))
        }
    };
    if let Some(dashes) = args.iter().position(|a| a == "--") {
        args.drain(..=dashes);
    }
    Ok((lookup, args))
}

/// `fleetctl ssh`
pub async fn run<C: Cluster>(
    ctx: &mut Ctx<C>,
    global: &Global,
    port: u16,
    forward_agent: bool,
    lookup: Lookup,
    command: &[String],
) -> Result<()> {
    let ip = match &lookup {
        Lookup::Machine(m) => by_machine(ctx, m).await?,
        Lookup::Unit(u) => by_unit(ctx, u).await?,
        Lookup::Either(arg) => {
            let machine = by_machine(ctx, arg).await;
            let unit = by_unit(ctx, arg).await;
            match (machine, unit) {
                (Ok(_), Ok(_)) => bail!(
                    "Unable to proceed: ambiguous argument, both machine and unit found for \
                     `{arg}`. Please use flag `--machine` or `--unit` to refine the search"
                ),
                (Ok(ip), Err(_)) | (Err(_), Ok(ip)) => ip,
                (Err(_), Err(_)) => {
                    bail!("Unable to proceed: could not find matching unit or machine")
                }
            }
        }
    };
    let mut argv = remote::ssh_argv(global, port, &ip, forward_agent);
    if !command.is_empty() {
        argv.push(command.join(" "));
    }
    match remote::exit_code(remote::run(&argv).await?) {
        0 => Ok(()),
        code => Err(Exit(code).into()),
    }
}

/// The public IP of the one live machine whose ID starts with `prefix`.
async fn by_machine<C: Cluster>(ctx: &Ctx<C>, prefix: &str) -> Result<String> {
    let machines = ctx.cluster.machines().await?.machines;
    let matches: Vec<&MachineInfo> = machines
        .iter()
        .filter(|m| m.id.as_str().starts_with(prefix))
        .collect();
    match matches.as_slice() {
        [] => bail!("Unable to proceed: machine does not exist"),
        [one] => address(one),
        _ => bail!("Unable to proceed: found more than one machine"),
    }
}

/// The public IP of the machine running the non-global unit `arg`.
async fn by_unit<C: Cluster>(ctx: &Ctx<C>, arg: &str) -> Result<String> {
    let name = UnitName::from_arg(arg)?;
    let (global, machines) = remote::machines_of(ctx, &name).await?;
    if global {
        bail!("Unable to proceed: global units unsupported");
    }
    match machines.first() {
        Some((_, Some(info))) => address(info),
        Some((id, None)) => bail!("Unable to proceed: machine {id} is not in the cluster any more"),
        None => bail!("Unable to proceed: unit {name} is not scheduled on any machine"),
    }
}

fn address(m: &MachineInfo) -> Result<String> {
    if m.public_ip.is_empty() {
        bail!("Could not determine address of machine {}.", m.id);
    }
    Ok(m.public_ip.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_bare_first_argument_is_a_machine_or_a_unit_and_the_rest_the_command() {
        let (lookup, cmd) = parse(None, None, words(&["abc", "ls", "-l"])).unwrap();
        assert_eq!(lookup, Lookup::Either("abc".into()));
        assert_eq!(cmd, words(&["ls", "-l"]));
        let (lookup, cmd) = parse(Some("abc".into()), None, words(&["--", "uptime"])).unwrap();
        assert_eq!(lookup, Lookup::Machine("abc".into()));
        assert_eq!(cmd, words(&["uptime"]));
        let (lookup, cmd) = parse(None, Some("hello.service".into()), vec![]).unwrap();
        assert_eq!(lookup, Lookup::Unit("hello.service".into()));
        assert!(cmd.is_empty());
    }

    #[test]
    fn refuses_no_target_and_both_flags() {
        let e = parse(None, None, vec![]).unwrap_err().to_string();
        assert!(e.contains("one machine or unit must be provided"), "{e}");
        let e = parse(Some("a".into()), Some("b".into()), vec![])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Both machine and unit"), "{e}");
    }
}
