//! `fleet-bench`: the benchmarks of `make bench` (issue 6), each runnable alone, each writing
//! its own section of `docs/benchmarks.md`:
//!
//! - `e2e`: a real 3-machine cluster (real etcd, systemd, release fleetd/fleetctl);
//! - `one-agent`: 3,000 units on one real machine, its idle D-Bus traffic and pass time;
//! - `scale`: 5,000 simulated machines (real agents and engines, fake systemd), 100,000 units;
//! - `plot`: convergence time over a grid of units and machines, drawn as an SVG, and how
//!   the time per unit grows (issue 19: linear within 1.3×);
//! - `limit`: etcd's raw write rate on this machine (issue 43), the floor the scale figures
//!   are given as ratios to;
//! - `plan`: the engine's scheduler alone (no etcd) on snapshots of those sizes: one pass
//!   with every unit unplaced, placed, and 1 % arriving;
//! - `reconnect`: 1,000 simulated machines, etcd killed and restarted: the requests per
//!   100 ms once it is back (whether agents reconnect in lockstep);
//! - `api`: the scale simulation with 10,000 units: a blocking `fleetctl start` and
//!   `fleetctl list-units`, over the API next to over etcd;
//! - `huge` (`make bench-huge`, not part of `make bench`): a million distinct units (with
//!   `--lab`, instances of 100 templates) on 5,000 simulated machines, etcd's db size and the
//!   engine's view per unit;
//!
//! `scale`, `plot`, `huge` and `api` run in the production shape unless `--lab` (see
//! `shape.rs`);
//! - `agent-probe` (internal): run by `one-agent` inside a machine.
//!
//! It measures; it never asserts the targets (they are reported as met or missed).

mod api;
mod counting;
mod e2e;
mod huge;
mod limit;
mod metered;
mod metrics;
mod monitor;
mod one_agent;
mod plan;
mod plot;
mod probe;
mod real;
mod reconnect;
mod report;
mod scale;
mod shape;
mod sim;
mod timeline;
mod verdict;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "fleet-bench", about = "fleet's benchmarks (make bench)")]
struct Cli {
    /// Print the results only; leave docs/benchmarks.md as it is.
    #[arg(long, global = true)]
    no_write: bool,
    /// Run the scale scenarios (`scale`, `plot`, `huge`, `api`) in the lab shape they were
    /// first measured in (16 shared etcd connections, 15 s deadlines, no etcd auth, no TLS,
    /// no events) instead of the production shape (docs/benchmarks.md, "Shapes").
    #[arg(long, global = true)]
    lab: bool,
    /// Change one factor of the shape, FACTOR=VALUE (repeatable): connections=N,
    /// auth=on|off, tls=on|off, events=on|off, deadline=Ns (fleetd's roles),
    /// client-deadline=Ns, engine-files=trusted|read. To see what each factor costs; the
    /// run's shape line names what was varied.
    #[arg(long, global = true, value_parser = clap::value_parser!(shape::Vary))]
    vary: Vec<shape::Vary>,
    #[command(subcommand)]
    scenario: Scenario,
}

/// How fleetd runs in the real machines.
#[derive(Debug, clap::Args)]
struct FleetdArgs {
    /// fleetd's `agent_ttl` (its default; the test harness's own is 3s).
    #[arg(long, default_value = "30s")]
    agent_ttl: String,
    /// More environment for fleetd, KEY=VALUE (repeatable), e.g. MALLOC_ARENA_MAX=2.
    #[arg(long)]
    fleetd_env: Vec<String>,
}

impl FleetdArgs {
    fn options(self) -> real::FleetdOptions {
        real::FleetdOptions {
            agent_ttl: self.agent_ttl,
            env: self.fleetd_env,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// End to end on a real 3-machine functional cluster.
    E2e {
        #[arg(long, default_value_t = 50)]
        runs: usize,
        #[arg(long, default_value_t = 300)]
        units: usize,
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        #[command(flatten)]
        fleetd: FleetdArgs,
    },
    /// One agent, many units, real systemd.
    OneAgent {
        #[arg(long, default_value_t = 3000)]
        units: usize,
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        #[command(flatten)]
        fleetd: FleetdArgs,
    },
    /// Simulated machines (real agents and engines on a fake systemd), real etcd.
    Scale {
        /// Issue 19's size: 100,000 units on 5,000 machines.
        #[arg(long, default_value_t = 5000)]
        machines: usize,
        #[arg(long, default_value_t = 100_000)]
        units: usize,
        /// At least the agents' 60 s resync, so the window holds one resync of each.
        #[arg(long, default_value_t = 60)]
        idle_secs: u64,
        /// The machines' lease TTL (fleetd's `agent_ttl`, 30 s by default); each machine
        /// renews its lease every third of it, which is most of etcd's requests at 5,000
        /// machines.
        #[arg(long, default_value_t = 30)]
        agent_ttl_secs: u64,
        /// The engines' `engine_move_rate`, units of lost machines moved per second (fleetd's
        /// default, 2,000, when not given; 0: no limit). The machine-loss figure's floor is
        /// the settle plus the lost units at this rate.
        #[arg(long)]
        move_rate: Option<u32>,
        /// Do not run the convergence again with the events switched the other way (issue
        /// 41's cost of events on the launch).
        #[arg(long)]
        no_events_compare: bool,
        /// How long the `events --follow` check emits events, at 1,000 a second (0: skip).
        #[arg(long, default_value_t = 10)]
        follow_secs: u64,
    },
    /// etcd's raw write rate on this machine (16 clients, transactions of 128 puts of
    /// 200-byte values, no compares), with docs/deploy.md's flags, etcd's defaults and the
    /// lab's.
    Limit {
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
    },
    /// fleetctl's latency over the API next to over etcd, on the scale simulation. By
    /// default at issue 19's size, 100,000 units: `make bench` writes those figures (the
    /// scenario takes under a minute there since the API takes many creates per request).
    Api {
        #[arg(long, default_value_t = 100)]
        machines: usize,
        #[arg(long, default_value_t = 100_000)]
        units: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// The API drops its held view after this long idle (fleetd's: 300 s); the scenario
        /// then idles this long and times the first, cold, listing.
        #[arg(long, default_value_t = 30)]
        held_idle_secs: u64,
    },
    /// Convergence time over a grid of machines and units, as docs/bench-scale.svg.
    Plot {
        /// Issue 19's linearity: from 1,000 to 100,000 units at 100 and at 5,000 machines.
        #[arg(long, value_delimiter = ',', default_value = "100,5000")]
        machines: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        units: Vec<usize>,
    },
    /// The engine's scheduler alone (no etcd): one pass on snapshots of these sizes.
    Plan {
        #[arg(long, value_delimiter = ',', default_value = "100,5000")]
        machines: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        units: Vec<usize>,
    },
    /// Simulated machines reconnecting after an etcd outage: requests per 100 ms once etcd
    /// is back.
    Reconnect {
        #[arg(long, default_value_t = 1000)]
        machines: usize,
        /// How long etcd stays down (long enough for every retry to reach its longest pause).
        #[arg(long, default_value_t = 20)]
        outage_secs: u64,
        /// How long to count once etcd answers again.
        #[arg(long, default_value_t = 5)]
        window_secs: u64,
    },
    /// A million distinct units (with `--lab`, instances of 100 templates) on 5,000
    /// simulated machines.
    Huge {
        #[arg(long, default_value_t = 5000)]
        machines: usize,
        #[arg(long, default_value_t = 1_000_000)]
        units: usize,
        /// Instances of this many templates instead of distinct unit files (100 with `--lab`).
        #[arg(long)]
        templates: Option<usize>,
        /// etcd's `--quota-backend-bytes` (etcd's default is 2 GiB).
        #[arg(long, default_value_t = 8 << 30)]
        quota_bytes: u64,
        /// How long to wait for every unit, after the last one is written, before reporting
        /// how far it got.
        #[arg(long, default_value_t = 1800)]
        within_secs: u64,
    },
    /// Records how long the whole `make bench` took (its last step).
    #[command(hide = true)]
    Total {
        #[arg(long)]
        secs: u64,
    },
    /// Internal: runs the agent in-process inside a functional-test machine and times passes.
    #[command(hide = true)]
    AgentProbe(probe::ProbeArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Ok(filter) = std::env::var("FLEET_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .with_writer(std::io::stderr)
            .init();
    }
    shape::set_varies(cli.vary.clone());
    let ran = run(cli);
    // The copies of etcd's users the run kept for its simulations (sim::auth).
    sim::forget_seeds();
    ran
}

#[allow(clippy::too_many_lines, reason = "one arm per bench, each a few lines")]
fn run(cli: Cli) -> Result<()> {
    let section = match cli.scenario {
        Scenario::E2e {
            runs,
            units,
            idle_secs,
            fleetd,
        } => {
            let idle = Duration::from_secs(idle_secs);
            let fleetd = fleetd.options();
            ("e2e", e2e::run(&bin_dir()?, runs, units, idle, &fleetd)?)
        }
        Scenario::OneAgent {
            units,
            idle_secs,
            fleetd,
        } => {
            let idle = Duration::from_secs(idle_secs);
            let fleetd = fleetd.options();
            let text = one_agent::run(&bin_dir()?, units, idle, &fleetd)?;
            ("one-agent", text)
        }
        Scenario::Scale {
            machines,
            units,
            idle_secs,
            agent_ttl_secs,
            move_rate,
            no_events_compare,
            follow_secs,
        } => {
            let args = scale::ScaleArgs {
                machines,
                units,
                idle: Duration::from_secs(idle_secs),
                agent_ttl: Duration::from_secs(agent_ttl_secs.max(3)),
                move_rate,
                shape: shape::ShapeSpec::from_env(shape_of(cli.lab), machines),
                events_compare: !no_events_compare,
                follow: Duration::from_secs(follow_secs),
                fleetctl: bin_dir()?.join("fleetctl"),
            };
            let name = if cli.lab { "scale-lab" } else { "scale" };
            (name, runtime()?.block_on(scale::run(args))?)
        }
        Scenario::Limit { keys } => ("limit", runtime()?.block_on(limit::run(keys))?),
        Scenario::Api {
            machines,
            units,
            runs,
            held_idle_secs,
        } => {
            let args = api::ApiArgs {
                machines,
                units,
                runs,
                shape: shape::ShapeSpec::from_env(shape_of(cli.lab), machines),
                held_idle: Duration::from_secs(held_idle_secs),
                fleetctl: bin_dir()?.join("fleetctl"),
            };
            let name = if cli.lab { "api-lab" } else { "api" };
            (name, runtime()?.block_on(api::run(args))?)
        }
        Scenario::Plot { machines, units } => {
            let (name, shape) = match cli.lab {
                true => ("plot-lab", shape::Shape::Lab),
                false => ("plot", shape::Shape::Production),
            };
            // A varied run's figures are a comparison, not the drawing of the shape.
            let svg = !cli.no_write && cli.vary.is_empty();
            (
                name,
                runtime()?.block_on(plot::run(&machines, &units, shape, svg))?,
            )
        }
        Scenario::Plan { machines, units } => ("plan", plan::run(&machines, &units)?),
        Scenario::Reconnect {
            machines,
            outage_secs,
            window_secs,
        } => {
            let (outage, window) = (
                Duration::from_secs(outage_secs),
                Duration::from_secs(window_secs),
            );
            (
                "reconnect",
                runtime()?.block_on(reconnect::run(machines, outage, window))?,
            )
        }
        Scenario::Huge {
            machines,
            units,
            templates,
            quota_bytes,
            within_secs,
        } => {
            let templates = match (templates, cli.lab) {
                (Some(t), _) => Some(t.max(1)),
                (None, true) => Some(100),
                (None, false) => None,
            };
            let spec = huge::HugeSpec {
                machines,
                units,
                templates,
                shape: shape::ShapeSpec::from_env(shape_of(cli.lab), machines),
                quota_bytes,
                within: Duration::from_secs(within_secs),
            };
            let name = if cli.lab { "huge-lab" } else { "huge" };
            (name, runtime()?.block_on(huge::run(spec))?)
        }
        Scenario::Total { secs } => ("total", report::total(Duration::from_secs(secs))),
        Scenario::AgentProbe(args) => return runtime()?.block_on(probe::run(args)),
    };
    println!("\n{}", section.1);
    if !cli.no_write {
        // A varied run writes a section of its own, next to the shape's.
        let name = match shape::varied_suffix(&cli.vary) {
            Some(suffix) => format!("{} {suffix}", section.0),
            None => section.0.to_owned(),
        };
        report::write_section(&name, &section.1)?;
    }
    Ok(())
}

fn shape_of(lab: bool) -> shape::Shape {
    if lab {
        shape::Shape::Lab
    } else {
        shape::Shape::Production
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Where the release `fleetd` and `fleetctl` are: `$FLEET_BIN_DIR`, else next to this
/// binary. Under `cargo run` (which sets `$CARGO`) missing ones are built first.
fn bin_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("FLEET_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()?
            .parent()
            .context("this binary has no directory")?
            .to_path_buf(),
    };
    let missing = ["fleetd", "fleetctl"]
        .iter()
        .any(|b| !dir.join(b).is_file());
    if missing {
        let Some(cargo) = std::env::var_os("CARGO") else {
            bail!(
                "no fleetd/fleetctl in {}: run `cargo build --release -p fleetd -p fleetctl` first",
                dir.display()
            );
        };
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "-p", "fleetd", "-p", "fleetctl"])
            .status()?;
        if !status.success() {
            bail!("building fleetd and fleetctl failed");
        }
    }
    Ok(dir)
}
