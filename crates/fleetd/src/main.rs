//! fleetd: the agent (always) and an engine candidate (unless `disable_engine`) of one machine.
//!
//! Stopping or restarting fleetd never stops the units it runs: on SIGTERM it stops its loops
//! and exits, leaving its lease to the restarted fleetd (or to expire).

mod api;
mod cli;
mod config;
mod engine;
mod fence;
mod generate;
mod inspect;
mod lock;
mod logging;
mod metrics;
mod notify;
mod public_ip;
mod report;
mod witness;

use anyhow::{Context, Result, bail};
use clap::Parser;
use fleet_agent::{Agent, AgentConfig, PresenceKeeper, SystemdConfig, SystemdManager};
use fleet_core::{MachineId, MachineInfo};
use fleet_registry::kv::{EtcdConfig, EtcdKv};
use fleet_registry::{MachineRole, Registry, SharedStore};
use std::process::ExitCode;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{Instrument, debug, error, info, warn};

use config::Config;
use lock::lock_runtime_dir;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const MACHINE_ID_FILE: &str = "/etc/machine-id";

#[allow(
    clippy::too_many_lines,
    reason = "the command line's early exits, then the configuration and logging, in the order fleetd needs them"
)]
fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if cli.print_version || cli.positional == ["version"] {
        println!("fleetd version {VERSION}");
        return ExitCode::SUCCESS;
    }
    if let Some(what) = cli.generate {
        return match generate::write(what, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fleetd: cannot write {what:?}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(units_dir) = cli.fence {
        return fence::run(units_dir);
    }
    if !cli.positional.is_empty() {
        eprintln!("fleetd takes no arguments. Did you mean to invoke fleetctl instead?");
        return ExitCode::FAILURE;
    }
    // Before any thread exists: it clears LISTEN_PID/LISTEN_FDS.
    let activated = match api::Activated::from_env() {
        Ok(a) => a,
        Err(e) => {
            let prefix = logging::stderr_error_prefix();
            eprintln!("{prefix}fleetd: {}", report::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let mut warnings = Vec::new();
    let config = match config::load(cli.config.as_deref(), &cli.given, &cli.set, &mut warnings) {
        Ok(c) => c,
        Err(e) => {
            let prefix = logging::stderr_error_prefix();
            eprintln!("{prefix}fleetd: bad configuration: {}", report::chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = logging::filter_directives(
        config.log_filter.as_deref(),
        rust_log.as_deref(),
        config.verbosity,
    );
    let (output, no_journal) = logging::init(config.log_format, &filter);
    if let Some(e) = no_journal {
        warn!(error = %e, "journald unreachable; logging to stderr");
    }
    debug!(?output, filter, "logging");
    for w in warnings {
        match w {
            config::Warning::Ignored(i) => {
                warn!(key = i.key, source = %i.source, "config key accepted but ignored");
            }
            config::Warning::PasswordInClear { endpoint } => warn!(
                endpoint = %endpoint,
                "the etcd password goes over plain http to this endpoint: whoever sees the network may read it; use https:// endpoints"
            ),
        }
    }
    if let Some(why) = fence::too_tight(config.agent_ttl, config.etcd_request_timeout)
        .filter(|_| !config.disable_fence)
    {
        warn!(reason = %why, "the fence may stop the units of a live fleetd");
    }
    // Blocking threads only run short file operations of the units directory. tokio's
    // default of 512 let a 1,000-unit start spawn ~40, each with its own malloc arena that
    // keeps its memory after the thread exits (issue 6: RSS under 20 MB with 1,000 units).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(run(config, activated)),
        Err(e) => Err(e).context("starting the runtime"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let e = report::chain(&e);
            if output == logging::Output::Journal {
                // journald ties a native entry to its unit by the sender's cgroup, looked up
                // when the entry arrives: from a process that exits at once it can miss
                // `journalctl -u fleet`. The stderr stream was tied to the unit when systemd
                // opened it, so the last words go there, at priority 3 (`<3>`).
                eprintln!("<3>fleetd failed: {e}");
            } else {
                error!(error = %e, "fleetd failed");
                eprintln!("fleetd: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

fn machine_id() -> Result<MachineId> {
    let text = std::fs::read_to_string(MACHINE_ID_FILE)
        .with_context(|| format!("unable to determine local machine ID from {MACHINE_ID_FILE}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("invalid machine ID in {MACHINE_ID_FILE}"))
}

#[allow(
    clippy::too_many_lines,
    reason = "fleetd's startup in the order it must happen (lock, listeners, API, fence, registration, agent, engine) and its stop; each step says why it comes where it does"
)]
async fn run(config: Config, activated: api::Activated) -> Result<()> {
    let notifier = std::sync::Arc::new(notify::Notifier::from_env());
    notify::spawn_watchdog(notifier.clone());
    let machine = machine_id()?;
    let etcd = EtcdConfig {
        endpoints: config.etcd_servers.clone(),
        request_timeout: config.etcd_request_timeout,
        tls: config.tls(),
        auth: config.etcd_auth.clone(),
    };
    let metrics = metrics::Metrics::new(VERSION);
    let kv = EtcdKv::connect(&etcd).await.context("connecting to etcd")?;
    let registry = Registry::new(metrics.registry.meter(kv), &config.etcd_key_prefix);
    let public_ip = config
        .public_ip
        .clone()
        .unwrap_or_else(|| public_ip::auto(&config.etcd_servers));
    let mut info = MachineInfo {
        id: machine.clone(),
        public_ip,
        metadata: config.metadata.clone(),
        version: VERSION.to_owned(),
        disable_engine: config.disable_engine,
        api: String::new(),
        fence_at: None,
    };
    let runtime_dir = config
        .units_directory
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| "/run/fleet".into());
    let _lock = lock_runtime_dir(&runtime_dir)?;
    // The API is up before this machine registers, so that it answers (503) while etcd is
    // away; its listeners are opened only once the lock says no other fleetd runs here.
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let listeners = api::listeners(&config.api, activated)?;
    api::warn_plain(&listeners);
    info.api = api::advertised(&config.api, &listeners, &info.public_ip);
    debug!(api = %info.api, "api address for this machine's presence");
    // Before the API: its status route reads unit properties through this connection.
    let systemd = SystemdManager::connect(SystemdConfig {
        units_dir: config.units_directory.clone(),
        ..SystemdConfig::default()
    })
    .await?;
    // Its own etcd connection: a client listing 10,000 units must not queue the agent's
    // lease renewals or the engine's writes behind its responses.
    let api_kv = EtcdKv::connect(&etcd)
        .await
        .context("connecting to etcd for the API")?;
    let inspector = std::sync::Arc::new(inspect::SystemInspector::new(systemd.clone()));
    // This machine's answer to peers asking whether it reaches etcd: its renewals, or a
    // probe on the keeper's connection (issue 36, src/witness.rs).
    let (renewals_tx, renewals_rx) = watch::channel(None);
    let (presence_tx, presence_seen) = watch::channel(None);
    let reach = witness::LeaseReach::new(
        renewals_rx,
        presence_seen,
        MachineRole::new(registry.clone(), machine.clone()),
    );
    let health = fleet_api::health::Health {
        machine: machine.to_string(),
        reach: std::sync::Arc::new(reach),
    };
    // One store of the registry per process: the engine leader plans on it and the API's
    // listings are served from it, so a leader that is listed holds one copy, not two. Its
    // one read and its watch go on the engine's connection; every page read from etcd and the
    // listings' present-revision reads stay on the API's.
    let stores = SharedStore::new(registry.clone());
    let api_registry = Registry::new(metrics.registry.meter(api_kv), &config.etcd_key_prefix);
    // Users' writes through this API, as events (issue 41), by the operator role's writer.
    let events = fleet_registry::UnitsRole::new(api_registry.clone())
        .event_log(
            fleet_registry::EventConfig::new(config.event_retention),
            metrics.events.clone(),
        )
        .into_sink();
    let served = api::build(
        api_registry,
        stores.clone(),
        &config.api,
        VERSION,
        Some((machine.clone(), inspector, config.deny_units.clone())),
        &metrics,
    )
    .with_health(health)
    .with_events(events);
    api::spawn(&mut tasks, served, listeners, shutdown_rx.clone());
    // Armed before this machine registers: a fleetd restarted while etcd is away pushes the
    // fence of the one before it forward, so that it stops nothing.
    let (fence_tx, fence_rx) = watch::channel(None);
    if !config.disable_fence {
        fence::spawn(
            &mut tasks,
            systemd.clone(),
            &config.units_directory,
            fence_rx.clone(),
            shutdown_rx.clone(),
        )?;
    }
    let manager = metrics.agent.meter(systemd);
    let stopping_info = info.clone();
    let keeper = PresenceKeeper {
        registry: MachineRole::new(registry.clone(), machine.clone()),
        info,
        ttl: config.agent_ttl,
        lease_file: runtime_dir.join("fleetd.lease"),
        fence: (!config.disable_fence).then_some(fence_tx),
        witnesses: witness::spawn(&mut tasks, &config, &registry, &machine, &shutdown_rx)?,
        renewals: Some(renewals_tx),
    };
    notifier.status("registering this machine in etcd");
    let presence = keeper
        .register()
        .await
        .context("registering this machine")?;
    info!(machine = %machine, version = VERSION, "fleetd started");
    notifier.status("registered; reconciling the units scheduled here");

    presence_tx.send_replace(Some(presence));
    let presence_rx = presence_tx.subscribe();
    let last_presence = presence_rx.clone();
    let mut agent_cfg = AgentConfig::new(machine.clone());
    agent_cfg.deny_units = config.deny_units.clone();
    agent_cfg.restarts_dir = Some(runtime_dir.join("restarts"));
    agent_cfg.trust_engine_files = config.trust_engine_files;
    let role = MachineRole::new(registry.clone(), machine.clone());
    agent_cfg.events = role
        .event_log(
            fleet_registry::EventConfig::new(config.event_retention),
            metrics.events.clone(),
        )
        .into_sink();
    let role_for_stop = role.clone();
    let mut agent =
        Agent::new(role, manager, agent_cfg, presence_rx).with_metrics(metrics.agent.clone());
    if !config.disable_fence {
        agent = agent.with_fence(fence_rx.clone());
    }
    notify::spawn_status(notifier.clone(), agent.progress());
    {
        let keep = keeper.keep(presence, presence_tx, shutdown_rx.clone());
        tasks.spawn(
            async move { keep.await.context("registering this machine again") }.in_current_span(),
        );
    }
    {
        let shutdown = shutdown_rx.clone();
        tasks.spawn(
            async move {
                agent.run(shutdown).await;
                Ok(())
            }
            .in_current_span(),
        );
    }
    if !config.disable_engine {
        engine::spawn(
            &mut tasks,
            stores,
            &machine,
            &config,
            shutdown_rx.clone(),
            &metrics,
        );
    }
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        _ = sigterm.recv() => { info!("SIGTERM: stopping; units keep running"); Ok(()) }
        _ = tokio::signal::ctrl_c() => { info!("SIGINT: stopping; units keep running"); Ok(()) }
        Some(res) = tasks.join_next() => match res {
            Ok(Ok(())) => bail!("a fleetd component stopped unexpectedly"),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(e).context("a fleetd component panicked"),
        },
    };
    notifier.stopping("stopping; units keep running");
    let _ = shutdown_tx.send(true);
    if !config.disable_fence {
        let presence = *last_presence.borrow();
        let deadline = fence_rx.borrow().map(|d| d.at);
        fence::announce_stop(
            &role_for_stop,
            presence,
            stopping_info,
            deadline,
            &config.units_directory,
        )
        .await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    outcome
}
