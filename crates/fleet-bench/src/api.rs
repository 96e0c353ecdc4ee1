//! Scenario `api` (issue 15): what fleetctl's two drivers cost a user at scale. On the scale
//! simulation (real etcd, real agents and engines on the fake systemd) with 10,000 units
//! launched, it times a blocking `fleetctl start` of one new unit and a `fleetctl
//! list-units`, each over `--driver etcd` (straight to etcd) and over `--driver api` (through
//! fleet's API on a unix socket), alternating the two so that both see the same load.
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
use crate::scale::converge;
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

/// What the scenario measured: per driver, each run's latency of each command.
#[derive(Debug, Default)]
struct Latencies {
    start: [Vec<Duration>; 2],
    list: [Vec<Duration>; 2],
}

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
    ]
}

pub async fn run(machines: usize, units: usize, runs: usize, fleetctl: &Path) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    println!("api: starting {machines} simulated machines");
    let sim = Sim::start(SimSpec::new(machines)).await?;
    let c = converge(&sim, units).await?;
    println!("api: {units} units launched in {}", secs(c.launched_in));
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
    let router = fleet_api::router(fleet_api::Api::new(
        registry,
        TOKEN_LIMIT,
        env!("CARGO_PKG_VERSION"),
    ));
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

            let mut list = global.clone();
            list.extend(["list-units".into(), "--no-legend".into()]);
            let (took, listed) = fleetctl_run(fleetctl, &list).await?;
            got.list[d].push(took);
            listings.push(listed);

            let mut destroy = global;
            destroy.extend(["destroy".into(), path.to_string_lossy().into_owned()]);
            fleetctl_run(fleetctl, &destroy).await?;
        }
        for listed in &listings {
            let rows = listed.lines().count();
            ensure!(
                rows > units,
                "list-units showed {rows} rows for {units}+ units"
            );
        }
    }
    Ok(got)
}

fn render(machines: usize, units: usize, runs: usize, got: &Latencies) -> String {
    let mut t = Table::new(&["command", "driver", "median", "p90", "max"]);
    let rows = [
        ("blocking `fleetctl start` of one unit", &got.start),
        ("`fleetctl list-units`", &got.list),
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
        "\n{units} units launched on {machines} simulated machines; {runs} runs of each \
         command per driver, the drivers alternating. The API is fleetd's router on a unix \
         socket (`token_limit` {TOKEN_LIMIT}), on its own etcd connection.\n\n{}",
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
            ["--driver", "api", "--endpoint", "unix:///b/fleet.sock"]
        );
        assert_eq!(
            driver_args(Driver::Etcd, "http://127.0.0.1:2379", socket),
            ["--driver", "etcd", "--endpoint", "http://127.0.0.1:2379"]
        );
    }
}
