//! `fleet-cluster`: a functional-test cluster that outlives the command, for `make demo` and
//! for poking at fleet by hand.
//!
//!   fleet-cluster up --machines 3 [--dir DIR] [--no-fleetd]   boot, print how to use it, exit
//!   fleet-cluster status [--dir DIR]                          what runs
//!   fleet-cluster down [--dir DIR]                            tear it all down
//!   fleet-cluster cleanup                                     what killed test runs left
//!
//! The cluster's state (processes, names, IDs, addresses, etcd endpoint) is in DIR/cluster.json.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use fleet_functional_tests::{
    Cluster, ClusterSpec, FleetdSpec, OutputExt, cleanup_stale, default_bin_dir,
};
use std::path::{Path, PathBuf};

#[derive(Debug, Parser)]
#[command(about = "Boot, inspect and tear down a local fleet cluster (etcd + systemd machines)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Boot a cluster and leave it running.
    Up {
        #[arg(long, default_value_t = 3)]
        machines: usize,
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
        /// Boot bare machines (systemd, journald, dbus), without fleetd.
        #[arg(long)]
        no_fleetd: bool,
        /// Where fleetd and fleetctl are (default: $FLEET_BIN_DIR or <cargo target dir>/debug).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// fleetd's agent TTL.
        #[arg(long, default_value = "3s")]
        agent_ttl: String,
        /// More environment for fleetd, KEY=VALUE (repeatable).
        #[arg(long = "env", value_parser = parse_env)]
        env: Vec<(String, String)>,
        /// etcd members; fleetd and fleetctl get every member's endpoint.
        #[arg(long, default_value_t = 1)]
        etcd_members: usize,
        /// Serve every fleetd's API also on TCP with TLS at this port of its machine's IP
        /// (certificates made into DIR/tls: the authority, and a client certificate for
        /// fleetctl).
        #[arg(long)]
        api_tls_port: Option<u16>,
    },
    /// Show the cluster's machines and etcd.
    Status {
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
    },
    /// Tear down the cluster in DIR.
    Down {
        #[arg(long, default_value_os_t = default_dir())]
        dir: PathBuf,
    },
    /// Remove what test runs that died without tearing down left behind.
    Cleanup,
}

/// `<cargo target dir>/demo`, where `make demo` keeps its cluster.
fn default_dir() -> PathBuf {
    fleet_functional_tests::functional_dir()
        .parent()
        .map(|target| target.join("demo"))
        .unwrap_or_else(|| PathBuf::from("target/demo"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Up {
            machines,
            dir,
            no_fleetd,
            bin_dir,
            agent_ttl,
            env,
            etcd_members,
            api_tls_port,
        } => {
            let bin_dir = bin_dir.unwrap_or_else(default_bin_dir);
            let fleetd = (!no_fleetd).then(|| FleetdSpec {
                bin_dir: bin_dir.clone(),
                agent_ttl,
                env: env.into_iter().collect(),
                api_tls_port,
                ..FleetdSpec::default()
            });
            up(ClusterSpec {
                machines,
                fleetd,
                bin_dir: Some(bin_dir),
                dir: Some(dir),
                etcd_members,
                ..ClusterSpec::default()
            })
        }
        Command::Status { dir } => status(&dir),
        Command::Cleanup => {
            for cleaned in cleanup_stale()? {
                println!("cleaned up stale {cleaned}");
            }
            Ok(())
        }
        Command::Down { dir } => {
            Cluster::down(&dir).with_context(|| format!("tearing down {}", dir.display()))?;
            println!("cluster in {} is down", dir.display());
            Ok(())
        }
    }
}

fn up(spec: ClusterSpec) -> Result<()> {
    for cleaned in cleanup_stale()? {
        println!("cleaned up stale {cleaned}");
    }
    let cluster = Cluster::start(spec)?;
    print_usage(&cluster);
    cluster.detach()?;
    Ok(())
}

/// `word` as one shell word: paths may hold spaces, and the printed lines are meant to be pasted.
fn quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn print_usage(cluster: &Cluster) {
    let dir = quoted(&cluster.dir().display().to_string());
    println!(
        "cluster {} is up; state in {}",
        cluster.run_id(),
        cluster.dir().join("cluster.json").display()
    );
    println!();
    println!("etcd:      {}", cluster.etcd_endpoint());
    println!(
        "fleetctl:  {} --endpoint {} list-machines",
        quoted(&cluster.fleetctl_path().display().to_string()),
        cluster.etcd_endpoint()
    );
    if let (Some(certs), Some(first)) = (cluster.api_certs(), cluster.machines().first()) {
        // Each machine's fleetd serves the API at its own IP; any one of them will do.
        if let Ok(url) = cluster.api_url(first) {
            println!("api:       {url}");
        }
        println!("ca:        {}", certs.ca().display());
        println!("cert:      {}", certs.client_cert().display());
        println!("key:       {}", certs.client_key().display());
    }
    println!();
    println!("machines (enter one with its nsenter line):");
    for m in cluster.machines() {
        println!(
            "  {}  {}  {}  {} bash",
            m.name(),
            m.ip(),
            m.id(),
            m.nsenter_prefix().join(" ")
        );
    }
    println!();
    let raw = cluster.dir().display();
    println!("logs:      {raw}/etcd.log, {raw}/machines/<name>/console.log,");
    println!("           and inside a machine: journalctl -u fleet");
    println!("status:    fleet-cluster status --dir {dir}");
    println!("down:      fleet-cluster down --dir {dir}");
}

fn status(dir: &Path) -> Result<()> {
    let cluster = Cluster::attach(dir)?;
    let etcd = if cluster.etcd_healthy() {
        "healthy"
    } else {
        "NOT healthy"
    };
    println!("etcd {} {etcd}", cluster.etcd_endpoint());
    let with_fleetd = cluster.state().fleetd.is_some();
    for m in cluster.machines() {
        if !m.is_up() {
            println!("  {}  {}  powered off", m.name(), m.ip());
            continue;
        }
        let system = m
            .systemctl(["is-system-running"])
            .map(|o| o.stdout_text().trim().to_owned())
            .unwrap_or_else(|e| format!("unknown ({e:#})"));
        let fleetd = if with_fleetd {
            m.systemctl(["is-active", "fleet.service"])
                .map(|o| format!("fleetd {}", o.stdout_text().trim()))
                .unwrap_or_default()
        } else {
            String::new()
        };
        println!(
            "  {}  {}  pid1 {}  {system}  {fleetd}",
            m.name(),
            m.ip(),
            m.pid1()
        );
    }
    Ok(())
}
