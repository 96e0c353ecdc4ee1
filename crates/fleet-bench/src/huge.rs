//! Scenario `huge` (`make bench-huge`, issue 19): instances of 100 templates on 5,000
//! simulated machines, one million by default, on the scale scenario's simulation (real
//! agents and engines on a fake systemd, one real etcd). The units are created through
//! fleetctl's own submit path with the arguments a shell makes of
//! `fleetctl start --no-block dir/huge-{00..99}@{0..9999}.service`.
//!
//! Measures when every unit was written, scheduled and reported launched; the bench's peak
//! memory (VmHWM: agents, engines and the benchmark's own watch, in one process); etcd's db
//! size, memory and keys; and the engine's view in bytes per unit, read by
//! `fleet-view-memory` (a binary of its own, whose allocator counts) from an in-memory
//! registry of the same units before the simulation starts.
//!
//! Only this scenario's etcd gets a larger `--quota-backend-bytes` (etcd's default, 2 GiB,
//! is not enough for a million units' records and their history); `--max-txn-ops` stays at
//! etcd's default of 128, the limit fleetd's own transactions keep to.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::report::{self, Table, secs, verdict};
use crate::scale::Roles;
use crate::scale::process_cpu;
use crate::shape::ShapeSpec;
use crate::sim::{Sim, SimSpec, Submitted};
use crate::verdict;

/// Issue 19's target: every unit launched within ten minutes.
const TARGET: Duration = Duration::from_secs(600);
/// Issue 43's: the million within 5× of etcd's raw time for the keys it writes.
const RAW_WITHIN: f64 = 5.0;
/// The most the view is measured at (an in-memory store of every record, plus the view).
const VIEW_UNITS: usize = 100_000;

/// What to run.
#[derive(Debug, Clone)]
pub struct HugeSpec {
    pub machines: usize,
    pub units: usize,
    /// Instances of this many templates; `None`: distinct unit files, one per unit (the
    /// production shape's default: agents read as many files as units).
    pub templates: Option<usize>,
    pub shape: ShapeSpec,
    /// etcd's `--quota-backend-bytes`.
    pub quota_bytes: u64,
    /// How long to wait for convergence after the last unit is written, before reporting
    /// what was reached (the figures still count from the submit's start).
    pub within: Duration,
}

/// Distinct units are written and submitted this many at a time, each batch's files removed
/// once submitted (a million files would take gigabytes of disk at once).
const BATCH: usize = 50_000;

/// Instance `i`: `huge-TT@N.service`, of template `i % templates` (as `fleet-view-memory`
/// names them).
pub fn unit_arg(dir: &Path, i: usize, templates: usize) -> String {
    let name = format!("huge-{:02}@{}.service", i % templates, i / templates);
    dir.join(name).to_string_lossy().into_owned()
}

/// The text of template `t` (as `fleet-view-memory` writes it).
pub fn template_text(t: usize) -> String {
    format!(
        "[Unit]\nDescription=fleet huge bench template {t}, instance %i\n\n\
         [Service]\nExecStart=/bin/sleep infinity\n"
    )
}

/// The engine view's memory, as `fleet-view-memory` prints it (`key=value` pairs).
#[derive(Debug, Clone, Default)]
struct ViewMemory {
    units: usize,
    bytes_per_unit: f64,
    with_malloc_per_unit: f64,
    allocations_per_unit: f64,
    /// Per-unit bytes of the units, schedule and states maps, and of a clone of the whole
    /// snapshot.
    parts: Vec<(String, f64)>,
}

fn view_memory(units: usize, machines: usize, templates: usize) -> Result<ViewMemory> {
    let bin = std::env::current_exe()?
        .parent()
        .context("this binary has no directory")?
        .join("fleet-view-memory");
    let out = std::process::Command::new(&bin)
        .args(["--units", &units.to_string()])
        .args(["--machines", &machines.to_string()])
        .args(["--templates", &templates.to_string()])
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "fleet-view-memory failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let pairs: Vec<(&str, f64)> = text
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect();
    let get = |key: &str| pairs.iter().find(|(k, _)| *k == key).map_or(0.0, |p| p.1);
    Ok(ViewMemory {
        units,
        bytes_per_unit: get("bytes_per_unit"),
        with_malloc_per_unit: get("with_malloc_per_unit"),
        allocations_per_unit: get("allocations_per_unit"),
        parts: ["units_map", "schedule_map", "states_map", "snapshot_clone"]
            .iter()
            .map(|k| ((*k).to_owned(), get(k)))
            .collect(),
    })
}

/// This process's peak resident memory (VmHWM), MiB.
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The 1-minute load average.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// How far the submit got.
#[derive(Debug, Default)]
struct Progress {
    /// The time spent resolving the arguments.
    prepared: Duration,
    /// The units written: every unit, or those written before the submit stopped.
    written: usize,
    /// What the submit stopped on (fleetctl's error), if it did not write every unit.
    stopped: Option<String>,
}

impl Progress {
    /// This progress after one more submit: its units written count, and its error
    /// (resolving its arguments, or the first unit it did not write) stops the submit.
    fn after(self, submit: Result<Submitted>) -> Progress {
        match submit {
            Err(e) => Progress {
                stopped: Some(format!("{e:#}")),
                ..self
            },
            Ok(s) => Progress {
                prepared: self.prepared + s.prepared,
                written: self.written + s.written,
                stopped: s.failed.map(|e| format!("{e:#}")),
            },
        }
    }
}

/// How far the run got.
#[derive(Debug)]
struct Reached {
    prepared_in: Duration,
    written_in: Duration,
    /// Units written, and the error the submit stopped on if that is not all of them.
    written: usize,
    stopped: Option<String>,
    /// Each `None` if not reached within the spec's limit.
    scheduled_in: Option<Duration>,
    launched_in: Option<Duration>,
    /// What was reached at the end.
    scheduled: usize,
    launched: usize,
    /// Requests past their deadline (all, then by role) and keep-alives of expired leases.
    timeouts: u64,
    timeouts_by_role: String,
    leases_lost: u64,
    bench_cpu: f64,
    etcd_cpu: f64,
    load_at_end: String,
}

/// Runs the scenario; returns its Markdown section.
#[allow(
    clippy::too_many_lines,
    reason = "the scenario's steps in the order they run, each measured where it happens"
)]
pub async fn run(spec: HugeSpec) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    let view_units = spec.units.min(VIEW_UNITS);
    let view_templates = spec.templates.unwrap_or(view_units);
    println!("huge: {}", spec.shape.line(spec.machines));
    println!("huge: measuring the engine's view at {view_units} units");
    let view = view_memory(view_units, spec.machines, view_templates)?;
    println!(
        "huge: the view keeps {:.0} bytes per unit ({:.0} with malloc's headers)",
        view.bytes_per_unit, view.with_malloc_per_unit
    );
    let mut sim_spec = SimSpec::shaped(spec.machines, spec.shape.clone());
    sim_spec
        .shape
        .etcd_args
        .insert(0, format!("--quota-backend-bytes={}", spec.quota_bytes));
    let etcd_args = sim_spec.shape.etcd_args.clone();
    let tls = sim_spec.shape.tls;
    println!("huge: starting {} simulated machines", spec.machines);
    let sim = Sim::start(sim_spec).await?;
    let dir = report::work_dir().join("huge");
    let before = Metrics::fetch(&sim.etcd_metrics())?;
    let roles = Roles::now(&sim);
    let cpu = process_cpu();
    println!("huge: starting {} units", spec.units);
    let t0 = Instant::now();
    let submitted = match spec.templates {
        Some(_) => {
            let args = write_templates(&dir, &spec)?;
            Progress::default().after(sim.submit(&args).await)
        }
        None => submit_distinct(&sim, &dir, spec.units).await?,
    };
    let written_in = t0.elapsed();
    // A submit that stopped is reported with what it reached: the units written before it
    // stopped are waited for as every unit would have been.
    let units = submitted.written;
    println!(
        "huge: {units} units prepared in {}, written in {}",
        secs(submitted.prepared),
        secs(written_in)
    );
    if let Some(e) = &submitted.stopped {
        println!(
            "huge: the submit stopped with {units} of {} units written: {e}",
            spec.units
        );
    }
    let wait = |what: &'static str, done: fn(&crate::monitor::View, usize) -> bool| {
        let sim = &sim;
        async move {
            if units == 0 {
                return None;
            }
            let res = sim
                .monitor
                .wait(t0, written_in + spec.within, what, |v| done(v, units))
                .await;
            match res {
                Ok(d) => Some(d),
                Err(e) => {
                    println!("huge: {e:#}");
                    None
                }
            }
        }
    };
    let scheduled_in = wait("every unit scheduled", |v, n| v.scheduled() >= n).await;
    if let Some(d) = scheduled_in {
        println!("huge: every unit scheduled in {}", secs(d));
    }
    let launched_in = match scheduled_in {
        Some(_) => wait("every unit launched", |v, n| v.launched() >= n).await,
        None => None,
    };
    if let (Some(b), Some(c)) = (scheduled_in, launched_in) {
        println!(
            "huge: {units} units submitted in {}, scheduled in {}, launched in {} (each from \
             the start of the submit)",
            secs(written_in),
            secs(b),
            secs(c)
        );
    }
    let waited = t0.elapsed();
    let counted = roles.since(&sim);
    let keys = counted.keys_written();
    let after = Metrics::fetch(&sim.etcd_metrics())?;
    let (scheduled, launched) = sim.monitor.with(|v| (v.scheduled(), v.launched()));
    let reached = Reached {
        prepared_in: submitted.prepared,
        written_in,
        written: units,
        stopped: submitted.stopped,
        scheduled_in,
        launched_in,
        scheduled,
        launched,
        timeouts: counted.timeouts(),
        timeouts_by_role: counted.timeouts_by_role(),
        leases_lost: counted.leases_lost(),
        bench_cpu: process_cpu() - cpu,
        etcd_cpu: after.sum("process_cpu_seconds_total", &[])
            - before.sum("process_cpu_seconds_total", &[]),
        load_at_end: load_average(),
    };
    let peak = peak_rss_mib();
    sim.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    println!("huge: etcd alone, for the {keys} keys the run wrote");
    let raw = crate::limit::raw_time(keys, &etcd_args, tls).await?;
    let verdicts = [
        verdict::million(spec.units, spec.machines, reached.launched_in),
        verdict::raw_ratio(
            "the million",
            reached.launched_in.ok_or(waited),
            raw.took,
            RAW_WITHIN,
        ),
    ];
    let verdicts = verdicts.map(|v| match &reached.stopped {
        Some(e) => verdict::stopped(v, reached.written, spec.units, e),
        None => v,
    });
    verdicts.iter().for_each(|v| println!("{}", v.line()));
    let mut out = report::provenance(wall, started.elapsed())
        .replace("(part of `make bench`)", "(`make bench-huge`)");
    out.push_str(&format!("\n{}.\n", spec.shape.line(spec.machines)));
    out.push_str(&crate::sim::etcd_line(&etcd_args));
    out.push('\n');
    out.push_str(&render(&spec, &reached, peak, &view, &after));
    out.push_str(&format!(
        "\nAgainst etcd alone (the `limit` loop, same flags, the {keys} keys this run \
         wrote): written in {}, launched in {}.\n\nGoals (issue 43):\n\n{}",
        crate::limit::ratio(reached.written_in, &raw),
        reached.launched_in.map_or_else(
            || "not reached".to_owned(),
            |d| crate::limit::ratio(d, &raw)
        ),
        verdict::table(&verdicts)
    ));
    Ok(out)
}

/// `fleetctl start --no-block` of `units` distinct unit files, [`BATCH`] at a time (each
/// batch's files written, submitted, removed), until a batch's submit fails. Prints a line
/// after each batch: how far the submit, the schedule and the launch got.
async fn submit_distinct(sim: &Sim, dir: &Path, units: usize) -> Result<Progress> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut done = Progress::default();
    let t0 = Instant::now();
    for start in (0..units).step_by(BATCH) {
        let mut args = Vec::with_capacity(BATCH);
        for i in start..(start + BATCH).min(units) {
            let path = dir.join(format!("huge-{i:07}.service"));
            std::fs::write(&path, distinct_text(i))
                .with_context(|| format!("writing {}", path.display()))?;
            args.push(path.to_string_lossy().into_owned());
        }
        let batch = Instant::now();
        let res = sim.submit(&args).await;
        args.iter().for_each(|a| {
            let _ = std::fs::remove_file(a);
        });
        let before = done.prepared;
        done = done.after(res);
        if done.stopped.is_some() {
            return Ok(done);
        }
        let (scheduled, launched) = sim.monitor.with(|v| (v.scheduled(), v.launched()));
        println!(
            "huge: {} of {units} units written at {} (this batch {}, resolving {}); \
             {scheduled} scheduled, {launched} launched",
            done.written,
            secs(t0.elapsed()),
            secs(batch.elapsed()),
            secs(done.prepared - before)
        );
    }
    Ok(done)
}

/// The text of distinct unit `i`.
pub fn distinct_text(i: usize) -> String {
    format!(
        "[Unit]\nDescription=fleet huge bench unit {i}\n\n\
         [Service]\nExecStart=/bin/sleep infinity\n"
    )
}

/// Writes the templates where a user keeps them; returns the instance arguments.
fn write_templates(dir: &PathBuf, spec: &HugeSpec) -> Result<Vec<String>> {
    let templates = spec.templates.unwrap_or(1).max(1);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for t in 0..templates {
        let path = dir.join(format!("huge-{t:02}@.service"));
        std::fs::write(&path, template_text(t))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((0..spec.units)
        .map(|i| unit_arg(dir, i, templates))
        .collect())
}

fn mib(bytes: f64) -> String {
    format!("{:.0} MiB", bytes / (1024.0 * 1024.0))
}

#[allow(
    clippy::too_many_lines,
    reason = "a report's text, written top to bottom as it reads"
)]
fn render(spec: &HugeSpec, r: &Reached, peak: f64, view: &ViewMemory, etcd: &Metrics) -> String {
    let mut t = Table::new(&["figure", "measured", "target", ""]);
    let reached = |d: Option<Duration>, n: usize| match d {
        Some(d) => secs(d),
        None => format!(
            "not within {} of the last write ({n} of {})",
            secs(spec.within),
            r.written
        ),
    };
    let (written, stopped, every) = match &r.stopped {
        None => (format!("{} units", spec.units), String::new(), "every unit"),
        Some(e) => (
            format!("{} of {} units", r.written, spec.units),
            format!("; then the submit stopped: {e}"),
            "every unit written",
        ),
    };
    t.row(vec![
        format!("{written} written (fleetctl's submit path)"),
        format!(
            "{} (of which resolving the arguments {}){stopped}",
            secs(r.written_in),
            secs(r.prepared_in)
        ),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        format!("{every} scheduled"),
        reached(r.scheduled_in, r.scheduled),
        String::new(),
        String::new(),
    ]);
    let met =
        r.launched_in.is_some_and(|d| d < TARGET) && spec.units >= 1_000_000 && r.stopped.is_none();
    t.row(vec![
        format!("{every} reported launched"),
        reached(r.launched_in, r.launched),
        format!("1,000,000 units in < {}", secs(TARGET)),
        verdict(met).into(),
    ]);
    t.row(vec![
        "etcd requests past their deadline / lease keep-alives of expired leases".into(),
        format!(
            "{} ({}) / {}",
            r.timeouts, r.timeouts_by_role, r.leases_lost
        ),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "bench peak memory (VmHWM: agents, engines, its watch)".into(),
        format!("{peak:.0} MiB"),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        format!("engine view per unit (at {} units)", view.units),
        format!(
            "{:.0} B asked for, {:.0} B with malloc's headers ({:.1} allocations)",
            view.bytes_per_unit, view.with_malloc_per_unit, view.allocations_per_unit
        ),
        String::new(),
        String::new(),
    ]);
    let parts: Vec<String> = view
        .parts
        .iter()
        .map(|(k, v)| format!("{k} {v:.0} B"))
        .collect();
    t.row(vec![
        "of which (with headers)".into(),
        parts.join(", "),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "engine view at 1,000,000 units (per unit × 10⁶)".into(),
        mib(view.with_malloc_per_unit * 1e6),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "etcd db size (in use)".into(),
        format!(
            "{} ({})",
            mib(etcd.sum("etcd_mvcc_db_total_size_in_bytes", &[])),
            mib(etcd.sum("etcd_mvcc_db_total_size_in_use_in_bytes", &[]))
        ),
        format!("quota {}", mib(spec.quota_bytes as f64)),
        String::new(),
    ]);
    t.row(vec![
        "etcd keys, memory".into(),
        format!(
            "{:.0} keys, {} resident",
            etcd.sum("etcd_debugging_mvcc_keys_total", &[]),
            mib(etcd.sum("process_resident_memory_bytes", &[]))
        ),
        String::new(),
        String::new(),
    ]);
    t.row(vec![
        "CPU: bench, etcd (during the run)".into(),
        format!("{:.0} s, {:.0} s", r.bench_cpu, r.etcd_cpu),
        String::new(),
        String::new(),
    ]);
    let mut s = t.render();
    s.push_str(&format!(
        "\n{} machines, {}; etcd `--quota-backend-bytes={}`, `--max-txn-ops` at its \
         default (128). Load average at the end: {} (the machine is shared).\n",
        spec.machines,
        spec.templates.map_or_else(
            || "a distinct unit file per unit".to_owned(),
            |t| format!("instances of {t} templates")
        ),
        spec.quota_bytes,
        r.load_at_end
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submit_that_stops_counts_the_units_it_wrote_and_keeps_its_error() {
        let ms = Duration::from_millis;
        let written = |prepared, written, failed| {
            Ok(Submitted {
                prepared,
                written,
                failed,
            })
        };
        let done = Progress::default().after(written(ms(20), 100, None));
        let done = done.after(written(ms(30), 50, None));
        assert_eq!((done.prepared, done.written), (ms(50), 150));
        assert!(done.stopped.is_none());
        let failed = anyhow::anyhow!("etcd request timed out after 1s").context("creating a");
        let stopped = done.after(written(ms(10), 49, Some(failed)));
        assert_eq!((stopped.prepared, stopped.written), (ms(60), 199));
        assert_eq!(
            stopped.stopped.as_deref(),
            Some("creating a: etcd request timed out after 1s")
        );
        let unread = anyhow::anyhow!("etcd request timed out after 3s").context("reading units");
        let stopped = Progress::default().after(Err(unread));
        assert_eq!((stopped.prepared, stopped.written), (ms(0), 0));
        assert_eq!(
            stopped.stopped.as_deref(),
            Some("reading units: etcd request timed out after 3s")
        );
    }
}
