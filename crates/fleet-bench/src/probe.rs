//! `agent-probe`: the real [`Agent`] on the real [`SystemdManager`], run by `one-agent` inside
//! a functional-test machine in place of its (stopped) fleetd, to time the agent's passes.
//!
//! A pass is timed from the first systemd call after the loop wakes (`installed()`, see
//! [`crate::metered`]) to the end of its `reconcile` span, caught by a tracing layer. Passes
//! woken by a systemd signal read the units directory and `ListUnitsByNames`; passes woken by
//! the periodic resync also re-read the schedule from etcd (and, in older agents, each unit's
//! details). It prints its findings as JSON.

use anyhow::{Context, Result};
use fleet_agent::{Agent, AgentConfig, PresenceKeeper, SystemdConfig, SystemdManager};
use fleet_core::{MachineId, MachineInfo};
use fleet_registry::kv::{EtcdConfig, EtcdKv, TlsFiles};
use fleet_registry::{DEFAULT_PREFIX, MachineRole, Registry};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::span::{Attributes, Id};
use tracing::{Instrument, Subscriber, level_filters::LevelFilter};
use tracing_subscriber::layer::{Context as LayerContext, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::counting::{Counters, Tally, counting};
use crate::metered::{Call, CallCounts};

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The cluster's etcd.
    #[arg(long)]
    etcd: String,
    #[arg(long, default_value = "/run/fleet/units")]
    units_dir: PathBuf,
    /// fleetd's saved lease, resumed so the machine's published states stay.
    #[arg(long, default_value = "/run/fleet/fleetd.lease")]
    lease_file: PathBuf,
    /// Passes to trigger with a systemd signal (a transient unit that starts and exits).
    #[arg(long, default_value_t = 5)]
    hints: usize,
    /// Resync passes to wait for.
    #[arg(long, default_value_t = 3)]
    resyncs: usize,
    #[arg(long, default_value_t = 4)]
    resync_secs: u64,
    /// The lease TTL if a new one must be granted (fleetd's `agent_ttl`).
    #[arg(long, default_value = "30s")]
    agent_ttl: String,
}

/// One timed pass.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PassSample {
    pub ms: f64,
    pub status_calls: u64,
    pub details_calls: u64,
    pub etcd_requests: u64,
}

/// What the probe prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    pub units: usize,
    pub resumed: bool,
    /// From starting the agent to the end of its first pass (preload, adopt, publish).
    pub boot_ms: f64,
    /// Passes woken by a systemd signal (nothing to do).
    pub light: Vec<PassSample>,
    /// Passes woken by the periodic resync (nothing to do).
    pub full: Vec<PassSample>,
}

/// The end of every `reconcile` span, with the agent's etcd tally at that moment.
#[derive(Debug, Clone)]
struct Passes {
    closed: Arc<Mutex<Vec<(Instant, Tally)>>>,
    counters: Arc<Counters>,
}

struct Opened;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Passes {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        if attrs.metadata().name() == "reconcile"
            && let Some(span) = ctx.span(id)
        {
            span.extensions_mut().insert(Opened);
        }
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let ours = ctx
            .span(&id)
            .is_some_and(|s| s.extensions().get::<Opened>().is_some());
        if ours {
            let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
            closed.push((Instant::now(), self.counters.tally()));
        }
    }
}

#[allow(
    clippy::too_many_lines,
    reason = "the probe's steps in the order they run, each measured where it happens"
)]
pub async fn run(args: ProbeArgs) -> Result<()> {
    let counters = Counters::new();
    let passes = Passes {
        closed: Arc::default(),
        counters: counters.clone(),
    };
    tracing_subscriber::registry()
        .with(passes.clone().with_filter(LevelFilter::INFO))
        .try_init()
        .context("installing the probe's tracing layer")?;
    let machine: MachineId = std::fs::read_to_string("/etc/machine-id")?
        .trim()
        .parse()
        .context("machine ID")?;
    let kv = EtcdKv::connect(&EtcdConfig {
        endpoints: vec![args.etcd.clone()],
        request_timeout: Duration::from_secs(2),
        tls: TlsFiles::default(),
        auth: None,
    })
    .await?;
    let registry = Registry::new(
        counting(kv.clone(), DEFAULT_PREFIX, vec![counters]),
        DEFAULT_PREFIX,
    );
    // fleetd's own keeper, on fleetd's lease file: it resumes the stopped fleetd's lease.
    let keeper = PresenceKeeper {
        registry: MachineRole::new(Registry::new(kv, DEFAULT_PREFIX), machine.clone()),
        info: MachineInfo {
            id: machine.clone(),
            public_ip: String::new(),
            metadata: Default::default(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            disable_engine: true,
            api: String::new(),
            fence_at: None,
        },
        ttl: parse_secs(&args.agent_ttl)?,
        lease_file: args.lease_file.clone(),
        fence: None,
        witnesses: None,
        renewals: None,
    };
    let presence = keeper.register().await?;
    let calls = CallCounts::timed();
    let systemd = SystemdManager::connect(SystemdConfig {
        units_dir: args.units_dir.clone(),
        ..SystemdConfig::default()
    })
    .await?;
    let manager = fleet_agent::Metered::new(systemd, calls.clone());
    let mut cfg = AgentConfig::new(machine.clone());
    cfg.resync_interval = Duration::from_secs(args.resync_secs);
    let (presence_tx, presence_rx) = watch::channel(Some(presence));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let keeper = tokio::spawn(
        keeper
            .keep(presence, presence_tx, shutdown_rx.clone())
            .in_current_span(),
    );
    let started = Instant::now();
    let agent = tokio::spawn(
        Agent::new(
            MachineRole::new(registry, machine.clone()),
            manager,
            cfg,
            presence_rx,
        )
        .run(shutdown_rx)
        .in_current_span(),
    );
    wait_passes(&passes, 1, Duration::from_secs(120)).await?;
    let boot_ms = passes
        .closed
        .lock()
        .map_or(0.0, |c| (c[0].0 - started).as_secs_f64() * 1000.0);
    let units = calls_units(&args.units_dir);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..args.hints {
        let unit = format!("bench-probe-hint-{i}");
        tokio::process::Command::new("systemd-run")
            .args(["--quiet", "--unit", &unit, "/bin/true"])
            .status()
            .await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let wait = Duration::from_secs(args.resync_secs * args.resyncs as u64 + 1);
    tokio::time::sleep(wait).await;
    let _ = shutdown.send(true);
    let _ = agent.await;
    let _ = keeper.await;
    let closed = passes.closed.lock().map(|c| c.clone()).unwrap_or_default();
    let (light, full) = split_passes(&closed, &calls.take_log());
    let result = ProbeResult {
        units,
        resumed: presence.resumed(),
        boot_ms,
        light,
        full,
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// `30s` or `3` (seconds).
fn parse_secs(text: &str) -> Result<Duration> {
    let n: u64 = text
        .trim_end_matches('s')
        .parse()
        .context("agent_ttl in whole seconds")?;
    Ok(Duration::from_secs(n))
}

fn calls_units(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

async fn wait_passes(passes: &Passes, n: usize, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    while passes.closed.lock().map_or(0, |c| c.len()) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the agent did not finish booting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Cuts the timeline into passes: the calls after one `reconcile` span ended up to the end
/// of the next belong to that next pass. Returns (signal-woken, resync) passes.
fn split_passes(
    closed: &[(Instant, Tally)],
    log: &[crate::metered::Timed],
) -> (Vec<PassSample>, Vec<PassSample>) {
    let (mut light, mut full) = (Vec::new(), Vec::new());
    for pair in closed.windows(2) {
        let ((from, before), (to, after)) = (&pair[0], &pair[1]);
        let calls: Vec<_> = log.iter().filter(|c| c.at > *from && c.at <= *to).collect();
        let Some(first) = calls.first() else {
            continue;
        };
        let count = |call: Call| calls.iter().filter(|c| c.call == call).count() as u64;
        let sample = PassSample {
            ms: (*to - first.at).as_secs_f64() * 1000.0,
            status_calls: count(Call::Status),
            details_calls: count(Call::Details),
            etcd_requests: (*after - *before).total(),
        };
        // A resync re-reads the schedule from etcd; a systemd signal wakes no etcd request.
        if sample.details_calls > 0 || sample.etcd_requests > 0 {
            full.push(sample);
        } else {
            light.push(sample);
        }
    }
    (light, full)
}
