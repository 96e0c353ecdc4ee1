//! fleetctl: drives a fleet cluster through fleetd's API (`--driver=api`, the default) or by
//! talking to its etcd registry directly (`--driver=etcd`); [`fleetctl::driver`] decides.

use anyhow::Result;
use fleet_ops::Cluster;
use fleet_ops::etcd::RegistryCluster;
use fleet_registry::Registry;
use fleet_registry::kv::{EtcdConfig, EtcdKv, TlsFiles};
use std::process::ExitCode;
use std::time::Duration;

use commands::submit::Verb;
use commands::wait::Block;
use fleetctl::cli::{self, Cli, Command};
use fleetctl::commands::watching::{self, Table};
use fleetctl::commands::{self, Ctx, lifecycle};
use fleetctl::driver::{self, Driver, HttpCluster};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// What `--debug` shows: fleetctl's and the fleet crates' debug lines, others' warnings.
const DEBUG_FILTER: &str = "warn,fleetctl=debug,fleet_=debug";

fn main() -> ExitCode {
    let cli = cli::parse();
    if cli.global.debug {
        // fleet's own debug output, not tower's, hyper's and h2's; RUST_LOG replaces it.
        let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| DEBUG_FILTER.to_owned());
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_env_filter(filter)
            .init();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error starting fleetctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`fleetctl list-units | head`): stop quietly with the status
        // a shell gives a command killed by SIGPIPE, as `cat` and `ls` end.
        Err(e) if e.downcast_ref::<BrokenPipe>().is_some() => ExitCode::from(141),
        // What status, journal or ssh ran said why; its exit status is fleetctl's.
        Err(e) if e.downcast_ref::<commands::remote::Exit>().is_some() => ExitCode::from(
            e.downcast_ref::<commands::remote::Exit>()
                .map_or(1, |x| x.0),
        ),
        // Ctrl-C during a blocking wait: what stays was said; a shell's status for SIGINT.
        Err(e) if e.downcast_ref::<commands::wait::Interrupted>().is_some() => ExitCode::from(130),
        // An error may quote what a remote fleetd or a host's record said: on a terminal,
        // its control characters are shown, not obeyed.
        Err(e) => {
            let text = format!("{e:#}");
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                let shown = fleetctl::terminal::neutralize(text.as_bytes());
                eprintln!("{}", String::from_utf8_lossy(&shown));
            } else {
                eprintln!("{text}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Standard output was a pipe whose reader has gone.
#[derive(Debug)]
struct BrokenPipe;

impl std::fmt::Display for BrokenPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("standard output was closed")
    }
}

impl std::error::Error for BrokenPipe {}

fn tls_files(global: &cli::Global) -> TlsFiles {
    TlsFiles {
        ca_file: global.ca_file.clone(),
        cert_file: global.cert_file.clone(),
        key_file: global.key_file.clone(),
    }
}

// In range: `cli::global::parse_seconds` took at most a day.
fn request_timeout(global: &cli::Global) -> Duration {
    Duration::from_secs_f64(global.request_timeout)
}

/// The API driver's client of the fleetd at `endpoint`; nothing is sent yet.
fn connect_api(global: &cli::Global, endpoint: &str) -> Result<HttpCluster> {
    HttpCluster::new(endpoint, &global.api_tls(), request_timeout(global))
        .map_err(|e| anyhow::anyhow!("Unable to initialize client: {e}"))
}

/// The etcd driver's settings: the endpoints, the TLS files and the credentials, checked.
fn etcd_config(global: &cli::Global, endpoint: &str) -> Result<EtcdConfig> {
    let auth = fleetctl::credentials::etcd_auth(
        global.username.as_deref(),
        global.password_file.as_deref(),
        std::env::var("FLEETCTL_PASSWORD").ok(),
    )
    .map_err(|e| anyhow::anyhow!("Unable to initialize client: {e:#}"))?;
    let config = EtcdConfig {
        endpoints: endpoint
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
        request_timeout: request_timeout(global),
        tls: tls_files(global),
        auth,
    };
    fleet_registry::input::check_endpoints(&config.endpoints, &config.tls)
        .and_then(|()| fleet_registry::input::check_prefix(&global.etcd_key_prefix))
        .map_err(|e| anyhow::anyhow!("Unable to initialize client: {e}"))?;
    for endpoint in fleetctl::credentials::in_clear(config.auth.as_ref(), &config.endpoints) {
        eprintln!(
            "Warning: the etcd password goes to {endpoint} over plain http, readable on the \
             network: use https://"
        );
    }
    Ok(config)
}

async fn connect_etcd(global: &cli::Global, endpoint: &str) -> Result<Registry<EtcdKv>> {
    let config = etcd_config(global, endpoint)?;
    let kv = EtcdKv::connect(&config)
        .await
        .map_err(|e| anyhow::anyhow!("Unable to initialize client: {e}"))?;
    Ok(Registry::new(kv, &global.etcd_key_prefix))
}

async fn activate<C: Cluster>(ctx: &mut Ctx<C>, a: cli::Activate, verb: Verb) -> Result<()> {
    let block = Block::from_flags(a.block.no_block, a.block.block_attempts);
    let how = fleet_ops::ReplaceHow {
        no_restart: a.no_restart,
        reschedule: a.reschedule,
        rolling: a.rolling.is_some(),
        fleet_form: false,
    };
    match a.rolling {
        Some(step) => {
            let step = usize::try_from(step).unwrap_or(usize::MAX);
            commands::rolling::run(ctx, &a.units, verb, block, how, step).await
        }
        None => lifecycle::load_or_start(ctx, &a.units, a.replace, verb, block, how).await,
    }
}

async fn run(cli: Cli) -> Result<()> {
    if cli.global.version {
        use std::io::Write;
        let mut out = std::io::stdout();
        let res = writeln!(out, "fleetctl version {VERSION}").and_then(|()| out.flush());
        return written(res);
    }
    let command = match cli.command {
        Some(c) => c,
        None => {
            cli::command().print_help()?;
            return Ok(());
        }
    };
    match command {
        Command::Version(a) => {
            let machines = cluster_machines(&cli.global)
                .await
                .map_err(|e| format!("{e:#}"));
            let mut ctx = local_ctx();
            commands::version::print(&mut ctx, VERSION, machines, a.output)?;
            return written(ctx.finish());
        }
        Command::Completion(a) => {
            let mut out = std::io::stdout();
            let wrote = fleetctl::completion::write_completion(a.shell, &mut out)
                .and_then(|()| std::io::Write::flush(&mut out));
            return written(wrote);
        }
        Command::Man(a) => {
            fleetctl::completion::write_man_pages(&a.dir)
                .map_err(|e| anyhow::anyhow!("writing man pages to {}: {e}", a.dir.display()))?;
            return Ok(());
        }
        _ => {}
    }
    let global = cli.global;
    let chosen = driver::select(global.driver, global.endpoint.as_deref());
    tracing::debug!(driver = ?chosen.driver, endpoint = %chosen.endpoint, "reaching the cluster");
    if let Command::Auth(a) = command {
        return auth(&global, &chosen, a).await;
    }
    if let Command::ImportFleet(a) = command {
        return import_fleet(&global, &chosen, a).await;
    }
    if let Command::Ui = command {
        let socket = chosen.endpoint.starts_with("unix://");
        let machines = match chosen.driver {
            Driver::Etcd if !socket => cluster_machines(&global).await?,
            _ => Vec::new(),
        };
        let mut ctx = local_ctx();
        for line in commands::ui::lines(&chosen, &machines) {
            ctx.print(&format!("{line}\n"));
        }
        return written(ctx.finish());
    }
    match chosen.driver {
        Driver::Api => {
            no_credentials_over_api(&global)?;
            let cluster = connect_api(&global, &chosen.endpoint)?;
            run_on(cluster, &global, command).await
        }
        Driver::Etcd => {
            let registry = connect_etcd(&global, &chosen.endpoint).await?;
            let log = event_log(&registry, &global);
            let cluster = RegistryCluster::new(registry)
                .with_events(log.sink())
                .acting_as(Some(&who(&global)));
            let outcome = run_on(cluster, &global, command).await;
            // What this command did is written before it exits, within one request timeout.
            log.close(request_timeout(&global)).await;
            outcome
        }
    }
}

/// The writer of the events of this command's actions (`--driver=etcd`).
fn event_log(registry: &Registry<EtcdKv>, global: &cli::Global) -> fleet_registry::EventLog {
    let retention = Duration::from_secs_f64(global.event_retention);
    fleet_registry::UnitsRole::new(registry.clone()).event_log(
        fleet_registry::EventConfig::new(retention),
        fleet_registry::EventStats::default(),
    )
}

/// Who acts, for the events of `--driver=etcd`: the etcd user, else the local user.
fn who(global: &cli::Global) -> String {
    match &global.username {
        Some(user) => format!("etcd user {user}"),
        None => local_user(),
    }
}

/// `local user <name> (uid <n>)`: `$USER` as the shell says it, the uid as the kernel does.
fn local_user() -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid());
    let name = std::env::var("USER").unwrap_or_default();
    match (name.is_empty(), uid) {
        (false, Ok(uid)) => format!("local user {name} (uid {uid})"),
        (true, Ok(uid)) => format!("local uid {uid}"),
        (false, Err(_)) => format!("local user {name}"),
        (true, Err(_)) => "local user".to_owned(),
    }
}

/// etcd's credentials mean nothing to fleet's API (it takes client certificates): refused
/// rather than dropped, so that nobody believes a command ran as the user named.
fn no_credentials_over_api(global: &cli::Global) -> Result<()> {
    let given = global.username.is_some() || global.password_file.is_some();
    if given {
        anyhow::bail!(
            "--username and --password-file are etcd's credentials, for --driver=etcd; \
             fleet's API authenticates clients by certificate (--cert-file, --key-file)"
        );
    }
    Ok(())
}

/// `fleetctl import-fleet`: fleet v1's registry read first, so that a wrong `--from` fails
/// before anything of ours is touched; then planned, printed and written, straight into etcd
/// or by fleetd's API (docs/migrating.md).
async fn import_fleet(
    global: &cli::Global,
    chosen: &driver::Selection,
    a: cli::ImportFleetArgs,
) -> Result<()> {
    use commands::import_fleet::run as import;
    let fleet = commands::import_fleet::read_fleet(&a, request_timeout(global)).await?;
    match chosen.driver {
        Driver::Api => {
            no_credentials_over_api(global)?;
            let cluster = connect_api(global, &chosen.endpoint)?;
            let mut ctx = with_cluster(cluster.clone());
            let outcome = import(&mut ctx, &cluster, &fleet, a.dry_run, a.replace).await;
            let output = ctx.finish();
            outcome.and_then(|()| written(output))
        }
        Driver::Etcd => {
            let registry = connect_etcd(global, &chosen.endpoint).await?;
            let importer = fleet_registry::Importer::new(registry.clone());
            let mut ctx = with_cluster(RegistryCluster::new(registry));
            let outcome = import(&mut ctx, &importer, &fleet, a.dry_run, a.replace).await;
            let output = ctx.finish();
            outcome.and_then(|()| written(output))
        }
    }
}

/// `fleetctl auth ...`: parse and read the password files, then administer etcd as the
/// user of the flags (root, once auth is on).
async fn auth(global: &cli::Global, chosen: &driver::Selection, a: cli::AuthCommand) -> Result<()> {
    use commands::auth::{self as cmd, Secret, SetupPasswords};
    let keys = fleet_registry::Keys::new(&global.etcd_key_prefix);
    let steps = match &a {
        cli::AuthCommand::Setup(s) => Some(cmd::setup(&keys, s, SetupPasswords::read(s)?)?),
        cli::AuthCommand::AddHost(h) => {
            let password = Secret(fleetctl::credentials::read_password(&h.host_password_file)?);
            Some(cmd::add_host(&keys, h, password)?)
        }
        cli::AuthCommand::RemoveHost(h) => Some(cmd::remove_host(&h.machine)?),
        cli::AuthCommand::List => None,
    };
    if chosen.driver == Driver::Api {
        anyhow::bail!(
            "fleetctl auth administers etcd's users and roles: use --driver=etcd (and \
             --endpoint of etcd); fleet's API has no user administration"
        );
    }
    let config = etcd_config(global, &chosen.endpoint)?;
    let admin = fleet_registry::rbac::Admin::connect(&config)
        .await
        .map_err(|e| anyhow::anyhow!("Unable to initialize client: {e}"))?;
    let mut ctx = local_ctx();
    let outcome = match steps {
        Some(steps) => cmd::apply(&mut ctx, &admin, &steps).await,
        None => cmd::list(&mut ctx, &admin).await,
    };
    let output = ctx.finish();
    outcome.and_then(|()| written(output))
}

/// The live machines, over the driver the flags choose.
async fn cluster_machines(global: &cli::Global) -> Result<Vec<fleet_core::MachineInfo>> {
    let chosen = driver::select(global.driver, global.endpoint.as_deref());
    let listing = match chosen.driver {
        Driver::Api => connect_api(global, &chosen.endpoint)?.machines().await?,
        Driver::Etcd => {
            let registry = connect_etcd(global, &chosen.endpoint).await?;
            RegistryCluster::new(registry).machines().await?
        }
    };
    Ok(listing.machines)
}

/// Somewhere to print for a command that needs no cluster.
fn local_ctx() -> Ctx<()> {
    with_cluster(())
}

/// Printing to the terminal, with `cluster`.
fn with_cluster<C>(cluster: C) -> Ctx<C> {
    Ctx {
        cluster,
        out: Box::new(std::io::stdout()),
        err: Box::new(std::io::stderr()),
        write_failed: None,
    }
}

/// Runs `command` on `cluster`, the same code over either driver.
async fn run_on<C: Cluster>(cluster: C, global: &cli::Global, command: Command) -> Result<()> {
    let mut ctx = Ctx {
        cluster,
        out: Box::new(std::io::stdout()),
        err: Box::new(std::io::stderr()),
        write_failed: None,
    };
    let outcome = execute(&mut ctx, global, command).await;
    let output = ctx.finish();
    outcome.and_then(|()| written(output))
}

/// The command's result once its output was written: a closed pipe is [`BrokenPipe`], any
/// other failed write an error.
fn written(output: std::io::Result<()>) -> Result<()> {
    match output {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(BrokenPipe.into()),
        Err(e) => Err(anyhow::Error::new(e).context("writing to standard output")),
    }
}

async fn execute<C: Cluster>(
    ctx: &mut Ctx<C>,
    global: &cli::Global,
    mut command: Command,
) -> Result<()> {
    if let Some(units) = command.many_units_mut() {
        *units = fleetctl::ranges::expand(units)?;
    }
    match command {
        Command::Submit(a) => commands::submit::run(ctx, &a.units, a.replace).await,
        Command::Load(a) => activate(ctx, a, Verb::Load).await,
        Command::Start(a) => activate(ctx, a, Verb::Start).await,
        Command::Stop(a) => {
            let block = Block::from_flags(a.block.no_block, a.block.block_attempts);
            lifecycle::stop(ctx, &a.units, block).await
        }
        Command::Unload(a) => {
            let block = Block::from_flags(a.block.no_block, a.block.block_attempts);
            lifecycle::unload(ctx, &a.units, block).await
        }
        Command::Restart(a) => {
            let block = Block::from_flags(a.block.no_block, a.block.block_attempts);
            lifecycle::restart(ctx, &a.units, block).await
        }
        Command::Status(a) => {
            let opts = commands::remote::StatusOptions {
                port: a.ssh_port,
                json: a.output == "json",
            };
            commands::remote::status(ctx, global, &opts, &a.units).await
        }
        Command::Journal(a) => {
            let opts = commands::remote::JournalOptions {
                lines: a.lines,
                follow: a.follow,
                output: a.output.clone(),
                sudo: a.sudo,
                port: a.ssh_port,
            };
            commands::remote::journal(ctx, global, &opts, &a.units).await
        }
        Command::Ssh(a) => {
            let (lookup, cmd) = commands::ssh::parse(a.machine, a.unit, a.args)?;
            commands::ssh::run(ctx, global, a.ssh_port, a.forward_agent, lookup, &cmd).await
        }
        Command::Cat(a) => commands::cat::run(ctx, &a.units).await,
        Command::ListUnitFiles(a) => watching::listing(ctx, Table::UnitFiles(&a)).await,
        Command::ListUnits(a) => watching::listing(ctx, Table::Units(&a)).await,
        Command::ListMachines(a) => watching::listing(ctx, Table::Machines(&a)).await,
        Command::Destroy(a) => commands::destroy::run(ctx, &a.units).await,
        Command::Drain(a) => {
            let opts = commands::maintenance::DrainOptions {
                parallel: a.parallel,
                force: a.force,
                block: commands::wait::Block::from_flags(a.no_block, a.block_attempts),
            };
            commands::maintenance::drain(ctx, &a.machine, opts).await
        }
        Command::Undrain(a) => commands::maintenance::undrain(ctx, &a.machine).await,
        Command::SetMetadata(a) => commands::metadata::set(ctx, &a.machine, &a.pairs).await,
        Command::UnsetMetadata(a) => commands::metadata::unset(ctx, &a.machine, &a.keys).await,
        Command::Explain(a) => {
            commands::maintenance::explain(ctx, &a.unit, a.output == "json").await
        }
        Command::Events(a) => commands::events::run(ctx, &a).await,
        Command::Version(_)
        | Command::Completion(_)
        | Command::Man(_)
        | Command::Auth(_)
        | Command::Ui
        | Command::ImportFleet(_) => {
            unreachable!("handled above")
        }
    }
}
