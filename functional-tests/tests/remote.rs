//! `fleetctl status` and `fleetctl journal` end to end: run on the unit's own machine they call
//! systemctl/journalctl there directly; run elsewhere they go through ssh to the machine's
//! public IP. The machines run no sshd, so the ssh program is replaced (FLEETCTL_SSH_COMMAND)
//! by a script that enters the machine with that IP and runs the remote command there: what is
//! checked is fleetctl's choice of machine and the command line it sends. Needs root.

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, Machine, cleanup_stale, inside_machine_args, leftovers,
    wait_for_value,
};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/units")
        .join(name)
        .display()
        .to_string()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A stand-in for ssh: `ssh [opts] -l user -- ip cmd...` runs `cmd` inside the machine with
/// `ip`.
fn fake_ssh(cluster: &Cluster) -> Result<PathBuf> {
    let mut cases = String::new();
    for m in cluster.machines() {
        cases.push_str(&format!(
            "  {}) exec {} sh -c \"$*\" ;;\n",
            m.ip(),
            m.nsenter_prefix().join(" ")
        ));
    }
    let script = format!(
        "#!/bin/bash\n# fleetctl's ssh, for tests: enter the machine instead.\n\
         while [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\ndest=$1\nshift\n\
         case \"$dest\" in\n{cases}  *) echo \"fake ssh: unknown destination $dest\" >&2; exit 255 ;;\nesac\n"
    );
    let path = cluster.dir().join("fake-ssh");
    std::fs::write(&path, script)?;
    Command::new("chmod").arg("+x").arg(&path).status()?;
    Ok(path)
}

/// Where `unit` runs, from `list-units --full`.
fn machine_of<'a>(cluster: &'a Cluster, unit: &str) -> Result<&'a Machine> {
    let id = wait_for_value(TIMEOUT, POLL, || {
        let o = cluster
            .fleetctl([
                "list-units",
                "--full",
                "--no-legend",
                "--fields",
                "unit,machine,active",
            ])
            .ok()?;
        String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.first() == Some(&unit) && cols.get(2) == Some(&"active"))
                .then(|| cols[1].split('/').next().unwrap_or_default().to_owned())
        })
    })
    .with_context(|| format!("{unit} never active"))?;
    cluster.machine_by_id(&id)
}

#[test]
fn status_and_journal_run_locally_on_the_units_machine_and_over_ssh_elsewhere() -> Result<()> {
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec::with_fleetd(2, FleetdSpec::default()))?;
    let o = cluster.fleetctl(["start", &fixture("hello.service")])?;
    ensure!(o.status.success(), "start failed: {}", text(&o));
    let here = machine_of(&cluster, "hello.service")?;
    // Inside a machine, over the API, fleetctl needs no endpoint: its own fleetd's socket.
    let inside = inside_machine_args(cluster.driver(), &cluster.etcd_endpoint());
    let inside_with = |args: &[&str]| -> Vec<String> {
        let mut all = inside.clone();
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    };

    // On the unit's machine: systemctl and journalctl run directly.
    let fleetctl = "/opt/fleet/bin/fleetctl";
    let o = here.exec(fleetctl, inside_with(&["status", "hello.service"]))?;
    ensure!(o.status.success(), "local status failed: {}", text(&o));
    ensure!(
        text(&o).contains("Active: active (running)"),
        "{}",
        text(&o)
    );
    let line = wait_for_value(TIMEOUT, POLL, || {
        let o = here
            .exec(
                fleetctl,
                inside_with(&["journal", "--lines", "50", "hello.service"]),
            )
            .ok()?;
        (o.status.success() && text(&o).contains("Hello, World!")).then(|| text(&o))
    })
    .context("local journal never showed the unit's output")?;
    ensure!(line.contains("Hello, World!"));

    // From the host (another machine-id): over "ssh" to the unit's machine.
    let ssh = fake_ssh(&cluster)?;
    let o = cluster
        .fleetctl_command(cluster.driver())?
        .args([
            "--strict-host-key-checking=false",
            "status",
            "hello.service",
        ])
        .env("FLEETCTL_SSH_COMMAND", &ssh)
        .output()?;
    ensure!(o.status.success(), "remote status failed: {}", text(&o));
    ensure!(
        text(&o).contains("Active: active (running)"),
        "{}",
        text(&o)
    );
    let o = cluster
        .fleetctl_command(cluster.driver())?
        .args(["journal", "--lines", "50", "hello.service"])
        .env("FLEETCTL_SSH_COMMAND", &ssh)
        .output()?;
    ensure!(
        o.status.success() && text(&o).contains("Hello, World!"),
        "remote journal: {}",
        text(&o)
    );

    // Errors: unknown unit, wrong argument count.
    let o = cluster.fleetctl(["status", "nope.service"])?;
    ensure!(
        !o.status.success() && text(&o).contains("Unit nope.service does not exist."),
        "{}",
        text(&o)
    );
    let o = cluster.fleetctl(["journal", "a.service", "b.service"])?;
    ensure!(
        !o.status.success() && text(&o).contains("One unit file must be provided."),
        "{}",
        text(&o)
    );

    let state = cluster.state().clone();
    cluster.shutdown()?;
    let left = leftovers(&state)?;
    ensure!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}
