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
use fleet_registry::kv::{EtcdConfig, EtcdKv, TlsFiles};
use fleet_registry::{DEFAULT_PREFIX, Registry};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::report::{self, Table, ms, percentile, secs};
use crate::scale::CONVERGE_WITHIN;
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
}

/// fleetctl's `--request-timeout` here: its default (3 s) failed a listing's request on a
/// debug build at load average 20 (a page is a snapshot of the registry); the command's
/// time is what is measured, not one request's.
const REQUEST_TIMEOUT: &str = "60";

/// The fleetctl arguments that select `driver`.
fn driver_args(driver: Driver, etcd: &str, socket: &Path) -> Vec<String> {
    let endpoint = match driver {
        Driver::Etcd => etcd.to_owned(),
        Driver::Api => format!("unix://{}", socket.display()),
    };
    vec![
        "--driver".into(),
        driver.name().into(),
        "--endpoint".into(),
        endpoint,
        "--request-timeout".into(),
        REQUEST_TIMEOUT.into(),
    ]
}

pub async fn run(machines: usize, units: usize, runs: usize, fleetctl: &Path) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    println!("api: starting {machines} simulated machines");
    let sim = Sim::start(SimSpec::new(machines)).await?;
    let dir = report::work_dir().join("api");
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("fleet.sock");
    let (stop, serving) = serve_api(&sim.etcd_endpoint(), &socket).await?;
    let measured = measure(&sim, fleetctl, &dir, &socket, units, runs).await;
    let _ = stop.send(true);
    let _ = serving.await;
    sim.stop().await;
    let measured = measured?;
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&crate::sim::etcd_line(&crate::sim::etcd_args_from_env()));
    out.push_str(&render(machines, units, runs, &measured));
    Ok(out)
}

/// fleet's API on `socket`, as fleetd serves it; stops when the sender says `true`.
async fn serve_api(
    etcd: &str,
    socket: &Path,
) -> Result<(watch::Sender<bool>, tokio::task::JoinHandle<()>)> {
    let config = EtcdConfig {
        endpoints: vec![etcd.to_owned()],
        request_timeout: Duration::from_secs(5),
        tls: TlsFiles::default(),
        auth: None,
    };
    let kv = EtcdKv::connect(&config)
        .await
        .context("connecting the API to etcd")?;
    let registry = Registry::new(kv, DEFAULT_PREFIX);
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    // As fleetd serves it: listings from a view held while they come.
    let api = fleet_api::Api::new(registry, TOKEN_LIMIT, env!("CARGO_PKG_VERSION"))
        .with_held_view(fleet_api::held::HELD_VIEW_IDLE);
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
async fn hold(etcd: &str, socket: &Path) -> Result<()> {
    let Some(path) = std::env::var_os("FLEET_BENCH_HOLD").map(PathBuf::from) else {
        return Ok(());
    };
    let text = format!(
        "--driver etcd --endpoint {etcd}\n--driver api --endpoint unix://{}\n",
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
    fleetctl: &Path,
    dir: &Path,
    socket: &Path,
    units: usize,
    runs: usize,
) -> Result<Latencies> {
    let etcd = sim.etcd_endpoint();
    let mut got = Latencies::default();
    let t0 = Instant::now();
    let etcd_args = driver_args(Driver::Etcd, &etcd, socket);
    got.start_all[Driver::Etcd as usize] = start_all(fleetctl, &etcd_args, dir, "e", units).await?;
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
    hold(&etcd, socket).await?;
    for run in 0..runs {
        // Alternate which driver goes first, so neither always meets a warmer etcd.
        let order = if run % 2 == 0 {
            Driver::ALL
        } else {
            [Driver::Api, Driver::Etcd]
        };
        let mut listings = Vec::new();
        for driver in order {
            let d = driver as usize;
            let global = driver_args(driver, &etcd, socket);
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
    }
    let api_args = driver_args(Driver::Api, &etcd, socket);
    got.start_all[Driver::Api as usize] = start_all(fleetctl, &api_args, dir, "a", units).await?;
    println!(
        "api: {units} more units started over the API in {}",
        secs(got.start_all[Driver::Api as usize])
    );
    Ok(got)
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
    fn each_driver_gets_its_endpoint() {
        let socket = Path::new("/b/fleet.sock");
        assert_eq!(
            driver_args(Driver::Api, "http://127.0.0.1:2379", socket),
            [
                "--driver",
                "api",
                "--endpoint",
                "unix:///b/fleet.sock",
                "--request-timeout",
                "60"
            ]
        );
        assert_eq!(
            driver_args(Driver::Etcd, "http://127.0.0.1:2379", socket),
            [
                "--driver",
                "etcd",
                "--endpoint",
                "http://127.0.0.1:2379",
                "--request-timeout",
                "60"
            ]
        );
    }
}
