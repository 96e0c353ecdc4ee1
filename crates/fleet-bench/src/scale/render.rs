//! The scale scenario's Markdown: the figures against their targets, the etcd requests per
//! unit by role and kind, and the notes (idle traffic, one start, machine loss).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Converged, Idle, LeaderLoss, Loss, Uninvolved};
use crate::counting::Method;
use crate::limit::{Raw, ratio};
use crate::report::{Table, ms, secs, verdict};

pub(super) fn render(
    c: &Converged,
    rss: f64,
    idle: &Idle,
    one: &anyhow::Result<Uninvolved>,
    loss: &Loss,
) -> String {
    let mut s = figures(c, rss, idle, one, loss).render();
    s.push_str(
        "\netcd requests per unit started, by role and kind (during the convergence; \
         `presence` is fleetd's lease keep-alive, proportional to machines × time, not units):\n\n",
    );
    s.push_str(&breakdown(c).render());
    s.push_str(&notes(c, idle, one, loss));
    s
}

fn per_unit(n: u64, units: usize) -> String {
    format!("{:.2}", n as f64 / units as f64)
}

fn row(t: &mut Table, figure: String, measured: String) {
    t.row(vec![figure, measured, String::new(), String::new()]);
}

fn target(t: &mut Table, figure: String, measured: String, goal: &str, met: bool) {
    t.row(vec![figure, measured, goal.into(), verdict(met).into()]);
}

#[allow(
    clippy::too_many_lines,
    reason = "one row per target, in the order the table shows them"
)]
fn figures(
    c: &Converged,
    rss: f64,
    idle: &Idle,
    one: &anyhow::Result<Uninvolved>,
    loss: &Loss,
) -> Table {
    let (u, n) = (c.units, c.machines);
    let mut t = Table::new(&["figure", "measured", "target", ""]);
    row(
        &mut t,
        format!("{u} units on {n} machines: all scheduled"),
        secs(c.scheduled_in),
    );
    let launched = c.launched_in < Duration::from_secs(60);
    let what = format!("{u} units on {n} machines: all reported launched");
    target(&mut t, what, secs(c.launched_in), "< 60 s", launched);
    row(
        &mut t,
        "of which fleetctl writing the units".into(),
        secs(c.submitted_in),
    );
    let since = |d: Duration| secs(d.saturating_sub(c.submitted_in));
    row(
        &mut t,
        "from the last unit written: all scheduled / all reported launched".into(),
        format!("{} / {}", since(c.scheduled_in), since(c.launched_in)),
    );
    row(
        &mut t,
        "time per unit launched (all launched / units)".into(),
        format!(
            "{:.3} ms",
            c.launched_in.as_secs_f64() * 1000.0 / u.max(1) as f64
        ),
    );
    let writes = c.roles.writes();
    let what = "etcd writes (put/delete ops) per unit started".to_owned();
    let small = (writes as f64) < 10.0 * u as f64;
    target(&mut t, what, per_unit(writes, u), "small constant", small);
    let what = "etcd requests per unit started (fleetctl + engine + agents)".to_owned();
    row(&mut t, what, per_unit(c.roles.requests(), u));
    let events = c.roles.agents.watch_events;
    let ratio = events as f64 / c.decisions.max(1) as f64;
    let measured = format!("{ratio:.2} ({events} events / {} decisions)", c.decisions);
    let what = "agent watch events per scheduling decision".to_owned();
    target(&mut t, what, measured, "1", events <= c.decisions);
    match one {
        Ok(one) => {
            let measured = format!(
                "{} (watch events to them: {}; involved machine found: {})",
                one.woken,
                one.stray_events,
                one.involved.is_some()
            );
            let nothing = one.woken == 0 && one.stray_events == 0 && one.involved.is_some();
            let what = "uninvolved agents woken by one `fleetctl start`".to_owned();
            target(&mut t, what, measured, "0", nothing);
            let what =
                "`fleetctl start` of one unit at this scale (blocking until active)".to_owned();
            row(&mut t, what, ms(one.latency));
        }
        Err(e) => {
            let what = "`fleetctl start` of one unit at this scale (blocking until active)";
            let measured = format!("failed: {}", one_line(&format!("{e:#}")));
            target(&mut t, what.into(), measured, "succeeds", false);
        }
    }
    let rate = match loss.move_rate {
        None => String::new(),
        Some(0) => ", `engine_move_rate` 0 (no limit)".to_owned(),
        Some(r) => format!(", `engine_move_rate` {r}"),
    };
    let what = format!(
        "lose {} machines ({}; {} units{rate}): leases ended / all rescheduled / running \
         elsewhere",
        loss.killed, loss.how, loss.affected
    );
    let measured = format!(
        "{} / {} / {}",
        secs(loss.expired_in),
        secs(loss.rescheduled_in),
        secs(loss.recovered_in)
    );
    let quick = loss.recovered_in <= loss.target;
    let goal = format!("running elsewhere ≤ {}", secs(loss.target));
    target(&mut t, what, measured, &goal, quick);
    let share = idle.busiest_share();
    let what = "idle: the busiest second's share of the agents' resync reads".to_owned();
    let total: u64 = idle.resyncs_per_second.iter().sum();
    let measured = format!(
        "{:.1} % ({} of {total} reads in {} s; even spread {:.1} %)",
        share * 100.0,
        idle.resyncs_per_second.iter().max().copied().unwrap_or(0),
        idle.window.as_secs(),
        100.0 / idle.resyncs_per_second.len().max(1) as f64
    );
    // Spread over the minute: no second with more than 5 % of them (lockstep was ~100 %).
    target(&mut t, what, measured, "spread (≤ 5 %)", share <= 0.05);
    let per_min = |n: u64| n as f64 * 60.0 / idle.window.as_secs_f64().max(1.0);
    let what = "idle: the leader's range reads per minute (watch only)".to_owned();
    match idle.leader_reads {
        Some(n) => target(&mut t, what, format!("{:.0}", per_min(n)), "0", n == 0),
        None => target(&mut t, what, "leadership changed".into(), "0", false),
    }
    row(
        &mut t,
        format!(
            "idle: the {} followers' reads of the leader key and its holder's presence per minute (a jittered 45–75 s safety net each)",
            idle.followers
        ),
        format!("{:.1}", per_min(idle.follower_reads)),
    );
    let what = "bench process RSS (1 process = all agents, engines, fake systemds)".to_owned();
    let per_machine = rss * 1024.0 / n as f64;
    row(
        &mut t,
        what,
        format!("{rss:.0} MiB ({per_machine:.0} KiB per machine)"),
    );
    let keep = &c.roles.presence;
    let what = "lease keep-alives during convergence: mean / slowest".to_owned();
    let measured = format!(
        "{} / {}",
        ms(keep.mean_latency(Method::KeepAlive)),
        ms(keep.max_latency(Method::KeepAlive))
    );
    row(&mut t, what, measured);
    let errors: Vec<String> = c
        .roles
        .all()
        .iter()
        .map(|(role, t)| format!("{role} {}", t.errors))
        .collect();
    row(
        &mut t,
        "etcd requests that failed during convergence".into(),
        errors.join(", "),
    );
    row(
        &mut t,
        "of which past their deadline / lease keep-alives of expired leases".into(),
        format!("{} / {}", c.roles.timeouts(), c.roles.leases_lost()),
    );
    let what = "CPU during convergence: bench process / etcd".to_owned();
    row(
        &mut t,
        what,
        format!("{:.1} s / {:.1} s", c.bench_cpu, c.etcd_cpu),
    );
    t
}

fn breakdown(c: &Converged) -> Table {
    let u = c.units;
    let mut t = Table::new(&["role", "request", "count", "per unit"]);
    for (role, tally) in c.roles.all() {
        for (m, class, n) in tally.breakdown() {
            let request = format!("{} {}", m.label(), class.label());
            t.row(vec![role.into(), request, n.to_string(), per_unit(n, u)]);
        }
        let w = tally.all_writes();
        if w > 0 {
            let request = "= put/delete ops".to_owned();
            t.row(vec![role.into(), request, w.to_string(), per_unit(w, u)]);
        }
    }
    t
}

fn notes(c: &Converged, idle: &Idle, one: &anyhow::Result<Uninvolved>, loss: &Loss) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut s = format!(
        "\netcd's own count of requests received during the convergence (its /metrics): {}\n",
        fmt_map(&c.etcd)
    );
    s.push_str(&format!(
        "\nEngine watch events during the convergence: {} (for {} decisions). \
         Engine range reads: {} ({:.1} MiB read).\n",
        c.roles.engines.watch_events,
        c.decisions,
        c.roles.engines.method(Method::Range),
        mib(c.roles.engines.read_bytes)
    ));
    let per_min = 60.0 / idle.window.as_secs_f64();
    let r = &idle.roles;
    s.push_str(&format!(
        "\nIdle ({} s with {} units running, scaled to one minute): engines {:.0} requests/min \
         ({:.1} MiB read/min), agents {:.0}/min, presence {:.0}/min; etcd saw {}.\n",
        idle.window.as_secs(),
        c.units,
        r.engines.total() as f64 * per_min,
        mib(r.engines.read_bytes) * per_min,
        r.agents.total() as f64 * per_min,
        r.presence.total() as f64 * per_min,
        fmt_map(&idle.etcd)
    ));
    if let Ok(one) = one {
        s.push_str(&format!(
            "\nOne `fleetctl start` at this scale: the involved agent made {} requests ({}); \
             the engines {} ({}); {} other agents ran their periodic 60 s resync inside the \
             window (not caused by the start); etcd saw {} in all.\n",
            one.involved_tally.total(),
            one.involved_tally,
            one.roles.engines.total(),
            one.roles.engines,
            one.resyncs,
            fmt_map(&one.etcd)
        ));
    }
    let seconds: Vec<String> = idle.resyncs_per_second.iter().map(u64::to_string).collect();
    s.push_str(&format!(
        "\nAgents' schedule reads (periodic resyncs) in each idle second: {}\n",
        seconds.join(" ")
    ));
    s.push_str(&format!(
        "\nMachine loss: {} requests by the engines, {} by the agents until recovered.\n",
        loss.roles.engines.total(),
        loss.roles.agents.total()
    ));
    s
}

/// The convergence's times as ratios to etcd's raw time for the keys it wrote.
pub(super) fn ratios(c: &Converged, raw: &Raw) -> String {
    format!(
        "\nAgainst etcd alone (the `limit` loop on a fresh etcd with the same flags, for the \
         {} keys this launch wrote: {:.0} keys/s): submitted in {}, scheduled in {}, launched \
         in {}.\n",
        raw.keys,
        raw.keys_per_second(),
        ratio(c.submitted_in, raw),
        ratio(c.scheduled_in, raw),
        ratio(c.launched_in, raw)
    )
}

/// The loss of the engine leader's machine.
pub(super) fn leader(loss: &anyhow::Result<LeaderLoss>) -> String {
    match loss {
        Ok(l) => format!(
            "\nThe engine leader's machine lost (crashed: its agent, lease and engine at once; \
             {} units on it): another engine led after {}, its units ran elsewhere after {}; \
             {} units of other machines were re-placed.\n",
            l.affected,
            secs(l.new_leader_in),
            secs(l.recovered_in),
            l.replaced
        ),
        Err(e) => format!(
            "\nThe engine leader's machine lost: {}\n",
            one_line(&format!("{e:#}"))
        ),
    }
}

/// An error's text on one table line, at most 200 characters.
fn one_line(text: &str) -> String {
    let flat = text.replace(['\n', '|'], " ");
    match flat.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &flat[..at]),
        None => flat,
    }
}

/// `Range 12, Txn 3`, or `nothing`.
pub fn fmt_map(m: &BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
    if parts.is_empty() {
        "nothing".to_owned()
    } else {
        parts.join(", ")
    }
}
