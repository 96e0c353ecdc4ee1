//! The fence (issue 36; docs/guarantees.md, promise 2): a machine whose fleetd is stopped or
//! hung has its non-global units stopped by its own systemd before the engine starts them
//! elsewhere, so that no unit ever runs on two machines. The ground truth is every machine's
//! systemd, polled every 250 ms for the whole fault (`Doubles`). Needs root.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, FleetdSpec, Machine, Signal, wait_for};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::{
    POLL, TIMEOUT, fleetctl, fleetctl_ok, fleetd_log, journal_cursor, start, units_on,
    wait_registered,
};

/// The agent TTL of these clusters.
const TTL: Duration = Duration::from_secs(3);
/// How long the fault lasts: 3 x TTL + 5 s, as the issue asks.
const FAULT: Duration = Duration::from_secs(14);
/// How often every machine's systemd is asked.
const SAMPLE: Duration = Duration::from_millis(250);

fn spec() -> FleetdSpec {
    FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5")
}

fn unit_text(i: usize) -> String {
    format!("[Service]\nExecStart=/bin/sleep {}\n", 200_000 + i)
}

const GLOBAL: &str = "[Service]\nExecStart=/bin/sleep 299999\n[X-Fleet]\nGlobal=true\n";

/// Starts `n` non-global units and one global unit, and waits until each runs.
fn start_units(cluster: &Cluster, n: usize) -> Result<Vec<String>> {
    let dir = cluster.dir().join("fence-units");
    std::fs::create_dir_all(&dir)?;
    let mut paths = Vec::new();
    let mut names = Vec::new();
    for i in 0..n {
        let name = format!("fenced-{i}.service");
        std::fs::write(dir.join(&name), unit_text(i))?;
        paths.push(dir.join(&name).display().to_string());
        names.push(name);
    }
    std::fs::write(dir.join("everywhere.service"), GLOBAL)?;
    paths.push(dir.join("everywhere.service").display().to_string());
    let mut args = vec!["start".to_owned()];
    args.extend(paths);
    fleetctl_ok(cluster, &args)?;
    wait_for(TIMEOUT, POLL, || {
        running(cluster, &names)
            .is_ok_and(|r| names.iter().all(|u| r.get(u).is_some_and(|m| m.len() == 1)))
    })
    .context("the units did not all start")?;
    Ok(names)
}

/// For each of `units`, the machines whose systemd has it in any state but inactive or
/// failed (its processes may be running).
fn running(cluster: &Cluster, units: &[String]) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in cluster.machines().iter().filter(|m| m.is_up()) {
        for (unit, view) in units_on(m, units)? {
            if view.active != "inactive" && view.active != "failed" {
                out.entry(unit).or_default().insert(m.name().to_owned());
            }
        }
    }
    Ok(out)
}

/// What polling every machine's systemd saw: the samples taken and each moment a unit was
/// running on two machines at once.
#[derive(Debug, Default)]
struct Doubles {
    samples: usize,
    seen: Vec<String>,
}

impl Doubles {
    fn sample(&mut self, cluster: &Cluster, units: &[String]) -> Result<()> {
        for (unit, machines) in running(cluster, units)? {
            if machines.len() > 1 {
                self.seen.push(format!("{unit} on {machines:?}"));
            }
        }
        self.samples += 1;
        Ok(())
    }

    fn ensure_none(&self) -> Result<()> {
        ensure!(
            self.seen.is_empty(),
            "a unit ran on two machines at once ({} of {} samples): {:?}",
            self.seen.len(),
            self.samples,
            self.seen
        );
        Ok(())
    }
}

/// Runs `body` while another thread polls every machine's systemd every [`SAMPLE`], from
/// before the body's first step to after its last.
fn sampled<T>(
    cluster: &Cluster,
    units: &[String],
    body: impl FnOnce() -> Result<T>,
) -> Result<(T, Doubles)> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| -> Result<Doubles> {
            let mut doubles = Doubles::default();
            while !stop.load(Ordering::Relaxed) {
                let sampled = Instant::now();
                doubles.sample(cluster, units)?;
                std::thread::sleep(SAMPLE.saturating_sub(sampled.elapsed()));
            }
            doubles.sample(cluster, units)?;
            Ok(doubles)
        });
        let out = body();
        stop.store(true, Ordering::Relaxed);
        let doubles = sampler
            .join()
            .map_err(|_| anyhow::anyhow!("the sampler panicked"))??;
        Ok((out?, doubles))
    })
}

/// The machine running the most of `units`.
fn busiest<'c>(cluster: &'c Cluster, units: &[String]) -> Result<&'c Machine> {
    let on = running(cluster, units)?;
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for machines in on.values() {
        for m in machines {
            *count.entry(m.clone()).or_default() += 1;
        }
    }
    let name = count
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(m, _)| m)
        .context("nothing runs")?;
    cluster.machine(&name)
}

/// At the end of a fault: every unit runs on exactly one machine other than `victim`, and the
/// global unit still runs on the victim (it is never fenced).
fn ensure_moved(cluster: &Cluster, units: &[String], victim: &Machine) -> Result<()> {
    wait_for(TIMEOUT, POLL, || {
        running(cluster, units).is_ok_and(|r| {
            units.iter().all(|u| {
                r.get(u)
                    .is_some_and(|ms| ms.len() == 1 && !ms.contains(victim.name()))
            })
        })
    })
    .with_context(|| format!("units not each on one machine other than {}", victim.name()))?;
    let global = units_on(victim, &["everywhere.service".to_owned()])?;
    ensure!(
        global["everywhere.service"].is_active(),
        "the global unit was fenced on {}",
        victim.name()
    );
    Ok(())
}

/// Stops the fleetd of the machine with the most units for 3 x TTL + 5 s: no unit is ever
/// active on two machines; each ends on one running machine; fleetd said at stopping when its
/// fence would fire, and `list-machines` said so too; the fence's own journal lines are there.
/// Then fleetd starts again: three machines, still never two copies.
#[test]
fn a_stopped_fleetd_fences_its_units_before_they_run_elsewhere() -> Result<()> {
    let (cluster, registry) = start(3, spec())?;
    let units = start_units(&cluster, 7)?;
    let victim = busiest(&cluster, &units)?;
    let cursor = journal_cursor(victim)?;
    let (listed, doubles) = sampled(&cluster, &units, || {
        victim.stop_fleetd()?;
        let listed = fleetctl(&cluster, &["list-machines"])?;
        std::thread::sleep(FAULT);
        ensure_moved(&cluster, &units, victim)?;
        victim.start_fleetd()?;
        wait_registered(&cluster, &registry)?;
        std::thread::sleep(2 * TTL);
        ensure_moved(&cluster, &units, victim)?;
        Ok(listed)
    })?;
    doubles.ensure_none()?;
    ensure!(
        listed
            .stderr
            .contains("fleetd is stopped: unless it returns"),
        "list-machines did not tell of the stopped fleetd: {listed:?}"
    );
    let log = fleetd_log(victim, &cursor)?;
    ensure!(
        log.contains("unless it returns by the deadline"),
        "fleetd did not warn of its fence at stopping:\n{log}"
    );
    let fence_log = victim.journal(&["-o", "cat", "--after-cursor", &cursor])?;
    ensure!(
        fence_log.contains("non-global units are stopped"),
        "the fence did not say what it did:\n{fence_log}"
    );
    eprintln!(
        "{} samples of every machine's systemd, no double run",
        doubles.samples
    );
    support::finish(cluster)
}

/// The same with fleetd frozen (SIGSTOP) for 3 x TTL + 5 s, then thawed.
#[test]
fn a_hung_fleetd_fences_its_units_before_they_run_elsewhere() -> Result<()> {
    let (cluster, registry) = start(3, spec())?;
    let units = start_units(&cluster, 7)?;
    let victim = busiest(&cluster, &units)?;
    let cursor = journal_cursor(victim)?;
    let ((), doubles) = sampled(&cluster, &units, || {
        victim.kill_fleetd(Signal::Stop)?;
        std::thread::sleep(FAULT);
        let moved = ensure_moved(&cluster, &units, victim);
        victim.kill_fleetd(Signal::Cont)?;
        moved?;
        // The moments right after the thaw are the dangerous ones: the fenced units' change
        // events arrive before the news of the new lease.
        wait_registered(&cluster, &registry)?;
        std::thread::sleep(2 * TTL);
        ensure_moved(&cluster, &units, victim)
    })?;
    doubles.ensure_none()?;
    let machines = registry.machine_ids()?;
    ensure!(machines.len() == 3, "machines after the thaw: {machines:?}");
    let log = fleetd_log(victim, &cursor)?;
    ensure!(
        log.contains("acting on nothing until its schedule is read on a live lease"),
        "the thawed fleetd did not hold its tasks:\n{log}"
    );
    eprintln!(
        "{} samples of every machine's systemd, no double run",
        doubles.samples
    );
    support::finish(cluster)
}

/// The port of the machines' TLS API, which their peers ask whether they reach etcd.
const API_PORT: u16 = 49155;

/// A machine cut off alone from etcd (a blackhole route to etcd inside it; its peers still
/// in reach) for 3 x TTL: its peers say they reach etcd, so its fence fires at its lease's
/// end, before the engine starts its units elsewhere. Never two copies; the global unit
/// keeps running. Then the route is healed: three machines again, still never two copies.
#[test]
fn a_machine_cut_off_alone_from_etcd_fences_its_units_before_they_run_elsewhere() -> Result<()> {
    let (cluster, registry) = start(3, spec().with_api_tls(API_PORT))?;
    let units = start_units(&cluster, 7)?;
    let victim = busiest(&cluster, &units)?;
    knows_its_peers(victim, 2)?;
    let ((), doubles) = sampled(&cluster, &units, || {
        cluster.cut_from_etcd(victim)?;
        std::thread::sleep(3 * TTL);
        let moved = ensure_moved(&cluster, &units, victim).with_context(|| {
            let log = support::fleetd_log_all(victim).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            format!(
                "the cut-off fleetd's last lines (newest first):\n{}",
                tail.join("\n")
            )
        });
        cluster.heal_from_etcd(victim)?;
        moved?;
        wait_registered(&cluster, &registry)?;
        std::thread::sleep(2 * TTL);
        ensure_moved(&cluster, &units, victim)
    })?;
    doubles.ensure_none()?;
    let log = support::fleetd_log_all(victim)?;
    ensure!(
        log.contains("cut off from etcd while others reach it"),
        "the cut-off fleetd did not say why it fenced:\n{log}"
    );
    eprintln!(
        "{} samples of every machine's systemd, no double run",
        doubles.samples
    );
    support::finish(cluster)
}

/// Waits until `machine`'s fleetd knows the API addresses of its `peers` (it reads them from
/// etcd 0, 1, 2, 4, 8 and 16 s after it starts, then every 30 s). A machine cut off before
/// it knows them cannot learn that it alone is cut off: the window docs/guarantees.md,
/// promise 2, documents, and not what this test is about. Without this wait the test failed
/// about one run in three: the victim had read its peers before they published.
fn knows_its_peers(machine: &Machine, peers: usize) -> Result<()> {
    let want = format!("peers={peers}");
    wait_for(Duration::from_secs(60), Duration::from_millis(250), || {
        support::fleetd_log_all(machine).is_ok_and(|log| {
            log.lines()
                .rev()
                .find(|l| l.contains("peers to ask when etcd does not answer"))
                .is_some_and(|l| l.contains(&want))
        })
    })
    .with_context(|| format!("{} never knew its {peers} peers", machine.name()))
}

/// A restart of fleetd within the TTL re-arms the fence before it fires: every unit keeps its
/// very process, and no fence ever ran. A fence that fires while fleetd lives (here run by
/// hand, as one whose new timer PID 1 armed late) reads the deadline fleetd pushed and stands
/// down.
#[test]
fn a_quick_restart_pushes_the_fence_forward_and_touches_no_unit() -> Result<()> {
    let (cluster, _registry) = start(3, spec())?;
    let units = start_units(&cluster, 4)?;
    let victim = busiest(&cluster, &units)?;
    let cursor = journal_cursor(victim)?;
    let before = identities(victim, &units)?;
    for _ in 0..3 {
        victim.restart_fleetd()?;
        std::thread::sleep(TTL / 3);
    }
    // Past the deadline of every fence armed before the last restart.
    std::thread::sleep(TTL + Duration::from_secs(1));
    let after = identities(victim, &units)?;
    ensure!(before == after, "restarted: {before:?} -> {after:?}");
    let fence_log = victim.journal(&["-o", "cat", "--after-cursor", &cursor])?;
    ensure!(
        !fence_log.contains("fence: fleetd did not push"),
        "a fence ran:\n{fence_log}"
    );
    let fence = format!("{}/fleetd", fleet_functional_tests::MACHINE_BIN_DIR);
    let out = victim.exec(&fence, ["--fence", support::UNITS_DIR])?;
    ensure!(out.status.success(), "the fence by hand failed: {out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        said.contains("nothing stopped"),
        "the fence did not stand down:\n{said}"
    );
    ensure!(
        identities(victim, &units)? == before,
        "the fence by hand stopped units"
    );
    support::finish(cluster)
}

/// MainPID and InvocationID of the active ones of `units` on `machine`.
fn identities(machine: &Machine, units: &[String]) -> Result<BTreeMap<String, (String, String)>> {
    Ok(units_on(machine, units)?
        .into_iter()
        .filter(|(_, v)| v.is_active())
        .map(|(u, v)| (u, v.identity()))
        .collect())
}
