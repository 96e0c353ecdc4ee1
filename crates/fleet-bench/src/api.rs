//! Scenario `api` (issues 15 and 19): what fleetctl's two drivers cost a user at scale. On
//! the scale simulation (real etcd, real agents and engines on the fake systemd) it times,
//! over `--driver etcd` (straight to etcd) and over `--driver api` (through fleet's API on a
//! unix socket):
//! - one command starting U instances of a submitted template
//!   (`fleetctl start --no-block 'e@{1..U}.service'`), until it returns (written): the etcd
//!   driver's first, on an empty registry; once every unit runs, the API driver's U more
//!   last (on a registry holding U already);
//! - with U units launched, a blocking `fleetctl start` of one new unit, `list-units` and
//!   `list-unit-files`, the drivers alternating so that both see the same load.
//!
//! The API is fleetd's own: `fleet_api::router` served by `fleet_api::serve` on a unix
//! socket, on its own etcd connection, as fleetd's `api` module runs it. It runs in this
//! process rather than in a fleetd because a fleetd on the bench host would also run an agent
//! against the host's systemd.

use anyhow::{Context, Result, ensure};
use fleet_registry::kv::{EtcdConfig, EtcdKv};
use fleet_registry::{DEFAULT_PREFIX, Registry};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::report::{self, Table, ms, percentile, secs};
use crate::scale::CONVERGE_WITHIN;
use crate::shape::{Shape, ShapeSpec};
use crate::sim::{Sim, SimSpec, unit_text};

/// fleetd's default `token_limit`.
const TOKEN_LIMIT: u16 = 100;

/// fleetctl's two drivers, as this scenario points them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    Etcd,
    Api,
}

impl Driver {
    const ALL: [Driver; 2] = [Driver::Etcd, Driver::Api];

    fn name(self) -> &'static str {
        match self {
            Driver::Etcd => "etcd",
            Driver::Api => "api",
        }
    }
}

/// What the scenario measured: per driver, each run's latency of each command, and the one
/// start of every unit.
#[derive(Debug, Default)]
struct Latencies {
    start_all: [Duration; 2],
    launched_in: Duration,
    start: [Vec<Duration>; 2],
    list: [Vec<Duration>; 2],
    list_files: [Vec<Duration>; 2],
    /// The API's first `list-units` once its held view was dropped.
    cold_list: Duration,
}

/// fleetctl's `--request-timeout` in the lab shape: its default (3 s) failed a listing's
/// request on a debug build at load average 20 (a page is a snapshot of the registry); the
/// command's time is what is measured, not one request's. The production shape keeps the
/// default and counts what fails.
const LAB_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The global fleetctl arguments of each driver.
#[derive(Debug, Clone)]
struct Globals {
    etcd: Vec<String>,
    api: Vec<String>,
}

impl Globals {
    fn new(sim: &Sim, socket: &Path) -> Result<Globals> {
        let timeout = match sim.spec.shape.shape {
            Shape::Lab => LAB_REQUEST_TIMEOUT,
            Shape::Production => sim.spec.shape.client_deadline,
        };
        Ok(Globals {
            etcd: sim.fleetctl_args_with(false, timeout)?,
            api: api_args(socket, timeout),
        })
    }

    fn of(&self, driver: Driver) -> &[String] {
        match driver {
            Driver::Etcd => &self.etcd,
            Driver::Api => &self.api,
        }
    }
}

/// The fleetctl arguments of the API driver on `socket`.
fn api_args(socket: &Path, timeout: Duration) -> Vec<String> {
    vec![
        "--driver".into(),
        "api".into(),
        "--endpoint".into(),
        format!("unix://{}", socket.display()),
        "--request-timeout".into(),
        timeout.as_secs_f64().to_string(),
    ]
}

/// What the scenario runs.
#[derive(Debug, Clone)]
pub struct ApiArgs {
    pub machines: usize,
    pub units: usize,
    pub runs: usize,
    pub shape: ShapeSpec,
    /// The API drops its held view after this long without a listing (fleetd's is 5 min);
    /// the scenario then waits this long and times the first listing, a cold one.
    pub held_idle: Duration,
    pub fleetctl: std::path::PathBuf,
}

pub async fn run(a: ApiArgs) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    let shape_line = a.shape.line(a.machines);
    println!("api: {shape_line}");
    println!("api: starting {} simulated machines", a.machines);
    let sim = Sim::start(SimSpec::shaped(a.machines, a.shape.clone())).await?;
    let dir = report::work_dir().join("api");
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("fleet.sock");
    let globals = Globals::new(&sim, &socket)?;
    let (stop, serving) = serve_api(&sim, &socket, a.held_idle).await?;
    let measured = measure(&sim, &a, &dir, &socket, &globals).await;
    let _ = stop.send(true);
    let _ = serving.await;
    sim.stop().await;
    let measured = measured?;
    let verdicts = verdicts(&measured);
    verdicts.iter().for_each(|v| println!("{}", v.line()));
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&format!("\n{shape_line}.\n"));
    out.push_str(&crate::sim::etcd_line(&a.shape.etcd_args));
    out.push_str(&render(a.machines, a.units, a.runs, &measured));
    out.push_str("\nGoals (issue 43):\n\n");
    out.push_str(&crate::verdict::table(&verdicts));
    Ok(out)
}

/// The API's cold listing under 1 s; a blocking start over the API under 100 ms (median).
fn verdicts(got: &Latencies) -> Vec<crate::verdict::Verdict> {
    use crate::verdict::{Verdict, against};
    let start = percentile(&got.start[Driver::Api as usize], 50.0);
    vec![
        Verdict {
            goal: "the API's first `list-units` after its view was dropped (idle) < 1 s".into(),
            measured: against(got.cold_list, Duration::from_secs(1)),
            met: got.cold_list < Duration::from_secs(1),
        },
        Verdict {
            goal: "a blocking `fleetctl start` over the API < 100 ms (median)".into(),
            measured: ms(start),
            met: start < Duration::from_millis(100),
        },
    ]
}

/// fleet's API on `socket`, as fleetd serves it; stops when the sender says `true`.
/// On its own connection: in the production shape as an operator (a host whose API takes
/// writes) on fleetd's deadline, in the lab's anonymously on 5 s.
async fn serve_api(
    sim: &Sim,
    socket: &Path,
    held_idle: Duration,
) -> Result<(watch::Sender<bool>, tokio::task::JoinHandle<()>)> {
    let (request_timeout, auth) = match sim.spec.shape.shape {
        Shape::Lab => (Duration::from_secs(5), None),
        Shape::Production => (
            sim.spec.shape.daemon_deadline,
            sim.credentials.as_ref().map(|c| c.operator.clone()),
        ),
    };
    let config = EtcdConfig {
        endpoints: vec![sim.etcd_endpoint()],
        request_timeout,
        tls: sim.etcd_tls(),
        auth,
    };
    let kv = EtcdKv::connect(&config)
        .await
        .context("connecting the API to etcd")?;
    let registry = Registry::new(kv, DEFAULT_PREFIX);
    // Users' writes through the API as events, as fleetd's API writes them.
    let events = match sim.spec.shape.events {
        true => fleet_registry::UnitsRole::new(registry.clone())
            .event_log(fleet_registry::EventConfig::default(), sim.events.clone())
            .into_sink(),
        false => fleet_registry::EventSink::off(),
    };
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    // As fleetd serves it: listings from a view held while they come.
    let api = fleet_api::Api::new(registry, TOKEN_LIMIT, env!("CARGO_PKG_VERSION"))
        .with_held_view(held_idle)
        .with_events(events);
    let router = fleet_api::router(api);
    let (stop, stopped) = watch::channel(false);
    let serving = tokio::spawn(fleet_api::serve(
        fleet_api::Listener::Unix(listener),
        router,
        stopped,
    ));
    Ok((stop, serving))
}

async fn fleetctl_run(fleetctl: &Path, args: &[String]) -> Result<(Duration, String)> {
    let t0 = Instant::now();
    let out = tokio::process::Command::new(fleetctl)
        .args(args)
        .output()
        .await
        .context("running fleetctl")?;
    let took = t0.elapsed();
    ensure!(
        out.status.success(),
        "fleetctl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((took, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// `fleetctl submit` of a template named `prefix@.service` in `dir`, then one `fleetctl start
/// --no-block 'prefix@{1..units}.service'` run from elsewhere (so the registry's template is
/// the content): how long the start took to return, everything written.
async fn start_all(
    fleetctl: &Path,
    global: &[String],
    dir: &Path,
    prefix: &str,
    units: usize,
) -> Result<Duration> {
    let template = dir.join(format!("{prefix}@.service"));
    std::fs::write(&template, unit_text(0, 1))?;
    let mut submit = global.to_vec();
    submit.extend(["submit".into(), template.to_string_lossy().into_owned()]);
    fleetctl_run(fleetctl, &submit).await?;
    let mut start = global.to_vec();
    start.extend([
        "start".into(),
        "--no-block".into(),
        format!("{prefix}@{{1..{units}}}.service"),
    ]);
    let (took, _) = fleetctl_run(fleetctl, &start).await?;
    Ok(took)
}

/// With `$FLEET_BENCH_HOLD` set to a path, writes the drivers' endpoints there and waits
/// until that file is removed: the cluster of U launched units stays up for a profiler
/// (`perf record -- fleetctl list-unit-files`) before anything is measured.
async fn hold(etcd_flags: &str, socket: &Path) -> Result<()> {
    let Some(path) = std::env::var_os("FLEET_BENCH_HOLD").map(PathBuf::from) else {
        return Ok(());
    };
    let text = format!(
        "--driver etcd {etcd_flags}\n--driver api --endpoint unix://{}\n",
        socket.display()
    );
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("api: holding until {} is removed", path.display());
    while path.exists() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn measure(
    sim: &Sim,
    a: &ApiArgs,
    dir: &Path,
    socket: &Path,
    g: &Globals,
) -> Result<Latencies> {
    let (fleetctl, units) = (a.fleetctl.as_path(), a.units);
    let mut got = Latencies::default();
    let t0 = Instant::now();
    got.start_all[Driver::Etcd as usize] =
        start_all(fleetctl, g.of(Driver::Etcd), dir, "e", units).await?;
    println!(
        "api: {units} units started over etcd in {}",
        secs(got.start_all[Driver::Etcd as usize])
    );
    got.launched_in = sim
        .monitor
        .wait(t0, CONVERGE_WITHIN, "every unit launched", |v| {
            v.launched() >= units
        })
        .await?;
    println!("api: {units} units launched in {}", secs(got.launched_in));
    hold(&sim.etcd_flags().join(" "), socket).await?;
    for run in 0..a.runs {
        one_run(&mut got, run, fleetctl, dir, g, units).await?;
    }
    println!(
        "api: idle for {} (the API drops its view)",
        secs(a.held_idle)
    );
    tokio::time::sleep(a.held_idle + Duration::from_secs(2)).await;
    let mut list = g.of(Driver::Api).to_vec();
    list.extend(["list-units".into(), "--no-legend".into()]);
    got.cold_list = fleetctl_run(fleetctl, &list).await?.0;
    println!(
        "api: the first listing after idle took {}",
        ms(got.cold_list)
    );
    got.start_all[Driver::Api as usize] =
        start_all(fleetctl, g.of(Driver::Api), dir, "a", units).await?;
    println!(
        "api: {units} more units started over the API in {}",
        secs(got.start_all[Driver::Api as usize])
    );
    Ok(got)
}

/// One run of each command per driver, the drivers' order alternating.
async fn one_run(
    got: &mut Latencies,
    run: usize,
    fleetctl: &Path,
    dir: &Path,
    g: &Globals,
    units: usize,
) -> Result<()> {
    // Alternate which driver goes first, so neither always meets a warmer etcd.
    let order = if run.is_multiple_of(2) {
        Driver::ALL
    } else {
        [Driver::Api, Driver::Etcd]
    };
    let mut listings = Vec::new();
    for driver in order {
        let d = driver as usize;
        let global = g.of(driver).to_vec();
        let path: PathBuf = dir.join(format!("probe-{}-{run}.service", driver.name()));
        std::fs::write(&path, unit_text(900_000 + 2 * run + d, 1))?;
        let mut start = global.clone();
        start.extend(["start".into(), "--block-attempts".into(), "30".into()]);
        start.push(path.to_string_lossy().into_owned());
        let (took, _) = fleetctl_run(fleetctl, &start).await?;
        got.start[d].push(took);
        for (command, samples) in [
            ("list-units", &mut got.list[d]),
            ("list-unit-files", &mut got.list_files[d]),
        ] {
            let mut list = global.clone();
            list.extend([command.into(), "--no-legend".into()]);
            let (took, listed) = fleetctl_run(fleetctl, &list).await?;
            samples.push(took);
            listings.push((command, listed));
        }
        let mut destroy = global;
        destroy.extend(["destroy".into(), path.to_string_lossy().into_owned()]);
        fleetctl_run(fleetctl, &destroy).await?;
    }
    for (command, listed) in &listings {
        let rows = listed.lines().count();
        ensure!(
            rows > units,
            "{command} showed {rows} rows for {units}+ units"
        );
    }
    Ok(())
}

fn render(machines: usize, units: usize, runs: usize, got: &Latencies) -> String {
    let mut t = Table::new(&["command", "driver", "median", "p90", "max"]);
    for driver in Driver::ALL {
        let took = ms(got.start_all[driver as usize]);
        t.row(vec![
            format!("`fleetctl start --no-block 'e@{{1..{units}}}.service'` (once)"),
            format!("`--driver {}`", driver.name()),
            took.clone(),
            took.clone(),
            took,
        ]);
    }
    let rows = [
        ("blocking `fleetctl start` of one unit", &got.start),
        ("`fleetctl list-units`", &got.list),
        ("`fleetctl list-unit-files`", &got.list_files),
    ];
    for (what, samples) in rows {
        for driver in Driver::ALL {
            let s = &samples[driver as usize];
            let max = s.iter().max().copied().unwrap_or_default();
            t.row(vec![
                what.to_owned(),
                format!("`--driver {}`", driver.name()),
                ms(percentile(s, 50.0)),
                ms(percentile(s, 90.0)),
                ms(max),
            ]);
        }
    }
    format!(
        "\n{units} instances of one template started by one `fleetctl start` over etcd \
         (launched on {machines} simulated machines {} after it began); then {runs} runs of \
         each other command per driver, the drivers alternating; last, {units} more \
         instances started by one command over the API (on a registry holding {units}). The \
         API is fleetd's router on a unix socket (`token_limit` {TOKEN_LIMIT}), on its own \
         etcd connection, with fleetd's held view: the first listing over the API reads it \
         (its time is in the max), later ones are served from it.\n\n{}",
        secs(got.launched_in),
        t.render()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_driver_gets_the_socket_and_the_shapes_deadline() {
        let socket = Path::new("/b/fleet.sock");
        assert_eq!(
            api_args(socket, Duration::from_secs(3)),
            [
                "--driver",
                "api",
                "--endpoint",
                "unix:///b/fleet.sock",
                "--request-timeout",
                "3"
            ]
        );
    }
}
