//! The shape a scale scenario runs in (issue 43): how many etcd connections the simulated
//! machines share, the request deadlines of the daemons and of fleetctl, whether etcd's
//! authentication is on, and etcd's flags. `production` (the default) is what a real cluster
//! runs: one connection per fleetd, fleetd's and fleetctl's default deadlines, one etcd user
//! and role per machine as `fleetctl auth add-host` makes them, etcd with the flags
//! docs/deploy.md recommends and nothing else, over TLS with client certificates as
//! docs/deploy.md runs it. `lab` (`--lab`) is the shape the scale figures
//! were first measured in, kept for comparison.
//!
//! Pure: the caller reads the open-file limit and the environment and passes them in.

use std::time::Duration;

mod vary;
pub use vary::{Vary, current as current_varies, set as set_varies, varied_suffix};

/// Which shape a scenario runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Production,
    Lab,
}

/// fleetd's default `etcd_request_timeout` (crates/fleetd, `config.rs`).
pub const FLEETD_DEADLINE: Duration = Duration::from_secs(1);
/// fleetctl's default `--request-timeout` (crates/fleetctl, `cli/global.rs`).
pub const FLEETCTL_DEADLINE: Duration = Duration::from_secs(3);
/// The lab's deadline for every role. One process simulating thousands of machines on two
/// cores is more loaded than any one fleetd; 15 s, not 5: at 5,000 machines etcd 3.4 itself
/// stalled for 10–27 s at a time during a 100,000-unit submit (docs/benchmarks.md "Scale
/// II"), and a 5 s deadline failed the submit in four runs of six.
pub const LAB_DEADLINE: Duration = Duration::from_secs(15);
/// The lab's shared connections.
pub const LAB_CONNECTIONS: usize = 16;
/// File descriptors kept for everything but the machines' connections (etcd's metrics
/// reads, fleetctl's pipes, the unit files, tokio).
const FD_RESERVE: u64 = 1024;

/// etcd 3.4's own election timings. The test harness's etcd runs with faster ones
/// (`fleet_testing::ETCD_FAST_ELECTIONS`); docs/deploy.md does not change them, so the
/// production shape puts etcd's defaults back (the last of a repeated flag wins).
pub const ETCD_DEFAULT_ELECTIONS: [&str; 3] = [
    "--heartbeat-interval=100",
    "--election-timeout=1000",
    "--pre-vote=false",
];

/// Everything that defines a shape, resolved for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeSpec {
    pub shape: Shape,
    /// etcd connections the simulated machines share (one each in production).
    pub connections: usize,
    /// Why fewer connections than machines, when so.
    pub shared_because: Option<String>,
    /// The per-request deadline of fleetd's roles (agents, presence, engines, the API).
    pub daemon_deadline: Duration,
    /// fleetctl's per-request deadline.
    pub client_deadline: Duration,
    /// etcd's authentication on, one user and role per machine.
    pub auth: bool,
    /// etcd's clients over TLS with client certificates (`--client-cert-auth`), as
    /// docs/deploy.md's section 2 runs it: every connection pays a handshake, every request
    /// its encryption.
    pub tls: bool,
    /// The simulation's etcd flags (before a scenario's own, e.g. `huge`'s quota).
    pub etcd_args: Vec<String>,
    /// Whether the roles write events (issue 41), as fleetd and fleetctl do by default.
    pub events: bool,
    /// fleetd's `trust_engine_files` (off by default): engines write small files into the
    /// schedule entries and agents take them from there.
    pub trust_engine_files: bool,
    /// The factors `--vary` changed, as the shape line names them.
    pub varied: Vec<String>,
}

impl ShapeSpec {
    /// The shape `shape` for `machines` machines. `fd_limit` is this process's open-file
    /// limit; `lab_etcd_args` the lab's flags as the environment sets them; `extra` the
    /// flags of `$FLEET_BENCH_ETCD_ARGS`.
    pub fn new(
        shape: Shape,
        machines: usize,
        fd_limit: u64,
        lab_etcd_args: Vec<String>,
        extra: &[String],
    ) -> ShapeSpec {
        match shape {
            Shape::Production => {
                let (connections, shared_because) = connections_for(machines, fd_limit);
                ShapeSpec {
                    shape,
                    connections,
                    shared_because,
                    daemon_deadline: FLEETD_DEADLINE,
                    client_deadline: FLEETCTL_DEADLINE,
                    auth: true,
                    tls: true,
                    etcd_args: deploy_etcd_args(extra),
                    events: true,
                    trust_engine_files: false,
                    varied: Vec::new(),
                }
            }
            Shape::Lab => ShapeSpec {
                shape,
                connections: LAB_CONNECTIONS.min(machines.max(1)),
                shared_because: None,
                daemon_deadline: LAB_DEADLINE,
                client_deadline: LAB_DEADLINE,
                auth: false,
                tls: false,
                etcd_args: lab_etcd_args,
                events: false,
                trust_engine_files: false,
                varied: Vec::new(),
            },
        }
    }

    /// The shape as this process finds it: its open-file limit, `$FLEET_BENCH_ETCD_ARGS`.
    pub fn from_env(shape: Shape, machines: usize) -> ShapeSpec {
        let extra: Vec<String> = std::env::var("FLEET_BENCH_ETCD_ARGS")
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        let lab = etcd_args_from_env();
        ShapeSpec::new(shape, machines, open_file_limit(), lab, &extra)
            .varied(current_varies(), machines)
    }

    /// `production` or `lab`.
    pub fn name(&self) -> &'static str {
        match self.shape {
            Shape::Production => "production",
            Shape::Lab => "lab",
        }
    }

    /// The line each run prints: `shape: production, 5000 etcd connections, deadlines 1 s /
    /// 3 s, etcd auth on, 5000 roles, …`.
    pub fn line(&self, machines: usize) -> String {
        let roles = if self.auth {
            format!("{machines} machine roles (+3 shared)")
        } else {
            "no roles".to_owned()
        };
        let shared = self
            .shared_because
            .as_ref()
            .map_or_else(String::new, |why| format!(" ({why})"));
        let flags = if self.etcd_args.is_empty() {
            "etcd's defaults".to_owned()
        } else {
            self.etcd_args.join(" ")
        };
        let varied = match self.varied.is_empty() {
            true => String::new(),
            false => format!(" (varied: {})", self.varied.join(", ")),
        };
        format!(
            "shape: {}{varied}, {} etcd connections for {machines} machines{shared}, deadlines \
             {} / {} (fleetd / fleetctl), etcd auth {}, {roles}, etcd TLS {}, events {}, etcd \
             flags: {flags}",
            self.name(),
            self.connections,
            seconds(self.daemon_deadline),
            seconds(self.client_deadline),
            on_off(self.auth),
            tls_words(self.tls),
            on_off(self.events),
        )
    }
}

fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

/// `on (client certificates, ECDSA P-256)` or `off`.
fn tls_words(on: bool) -> &'static str {
    if on {
        "on (client certificates, ECDSA P-256)"
    } else {
        "off"
    }
}

/// `1 s`, `0.5 s`.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s} s")
    }
}

/// One connection per machine, unless this process cannot open that many sockets: then as
/// many as its open-file limit leaves after [`FD_RESERVE`], and why.
pub fn connections_for(machines: usize, fd_limit: u64) -> (usize, Option<String>) {
    let room = usize::try_from(fd_limit.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
    if machines <= room {
        return (machines.max(1), None);
    }
    let why = format!(
        "shared: the open-file limit {fd_limit} leaves {room} sockets after {FD_RESERVE} for \
         the rest"
    );
    (room.max(1), Some(why))
}

/// docs/deploy.md's etcd flags (section 9, "Thousands of machines on etcd 3.4"), etcd's own
/// election timings, then `extra`.
pub fn deploy_etcd_args(extra: &[String]) -> Vec<String> {
    ETCD_TUNING
        .iter()
        .chain(ETCD_DEFAULT_ELECTIONS.iter())
        .map(|a| (*a).to_owned())
        .chain(extra.iter().cloned())
        .collect()
}

/// This process's soft open-file limit (`/proc/self/limits`), 1024 if unreadable.
pub fn open_file_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    soft_limit(&limits, "Max open files").unwrap_or(1024)
}

/// The soft limit of `name` in a `/proc/<pid>/limits` text.
fn soft_limit(limits: &str, name: &str) -> Option<u64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// How the simulation's etcd commits its backend: at most 1,000 writes or 25 ms between two
/// commits (etcd 3.4's defaults are 10,000 and 100 ms). etcd 3.4 copies every uncommitted
/// write into each read transaction and each `Txn` with compares (docs/benchmarks.md, "The
/// scheduler's own curve, etcd's stall, …"), so under 5,000 machines' keep-alives a larger
/// buffer stalls etcd: `scale` at 100,000 units launched in 295 s with the defaults and in
/// 72 s with these, with etcd's CPU at 343 s and 65 s. docs/deploy.md recommends them
/// for large clusters. `FLEET_BENCH_ETCD_DEFAULTS=1` runs etcd without them.
/// With auth on (the production shape), docs/deploy.md's `--bcrypt-cost=4` too: at etcd's
/// cost 10, 5,000 simulated fleetds logging in at once kept etcd's CPU busy for minutes.
pub const ETCD_TUNING: [&str; 3] = [
    "--backend-batch-limit=1000",
    "--backend-batch-interval=25ms",
    "--bcrypt-cost=4",
];

/// The etcd flags a simulation starts with: [`ETCD_TUNING`] unless
/// `$FLEET_BENCH_ETCD_DEFAULTS` is set, then `$FLEET_BENCH_ETCD_ARGS`.
pub fn etcd_args_from_env() -> Vec<String> {
    let tuning = std::env::var_os("FLEET_BENCH_ETCD_DEFAULTS").is_none();
    let extra = std::env::var("FLEET_BENCH_ETCD_ARGS").unwrap_or_default();
    ETCD_TUNING
        .iter()
        .filter(|_| tuning)
        .map(|a| (*a).to_owned())
        .chain(extra.split_whitespace().map(str::to_owned))
        .collect()
}

/// The paragraph saying how the simulation's etcd ran, after a section's provenance.
pub fn etcd_line(args: &[String]) -> String {
    if args.is_empty() {
        "\nThe simulation's etcd ran with its defaults.\n".to_owned()
    } else {
        format!("\nThe simulation's etcd ran with `{}`.\n", args.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn production(machines: usize, fd_limit: u64) -> ShapeSpec {
        ShapeSpec::new(Shape::Production, machines, fd_limit, vec![], &[])
    }

    #[test]
    fn production_gives_every_machine_its_own_connection_when_the_sockets_fit() {
        let s = production(5000, 20_000);
        assert_eq!((s.connections, s.shared_because), (5000, None));
        assert_eq!(
            (s.daemon_deadline, s.client_deadline),
            (FLEETD_DEADLINE, FLEETCTL_DEADLINE)
        );
        assert!(s.auth && s.events && s.tls);
    }

    #[test]
    fn production_shares_connections_and_says_why_when_the_limit_is_too_low() {
        let s = production(5000, 4096);
        assert_eq!(s.connections, 3072);
        assert!(s.shared_because.unwrap().contains("4096"));
    }

    #[test]
    fn production_runs_etcd_with_the_deploy_guides_flags_and_etcds_elections() {
        let s = production(10, 20_000);
        assert_eq!(
            s.etcd_args,
            [
                "--backend-batch-limit=1000",
                "--backend-batch-interval=25ms",
                "--bcrypt-cost=4",
                "--heartbeat-interval=100",
                "--election-timeout=1000",
                "--pre-vote=false"
            ]
        );
    }

    #[test]
    fn lab_keeps_sixteen_connections_long_deadlines_and_no_auth() {
        let s = ShapeSpec::new(Shape::Lab, 5000, 20_000, vec!["--x".into()], &[]);
        assert_eq!(s.connections, 16);
        assert_eq!(s.daemon_deadline, LAB_DEADLINE);
        assert!(!s.auth && !s.events && !s.tls);
        assert_eq!(s.etcd_args, ["--x"]);
    }

    #[test]
    fn the_shape_line_names_the_numbers_that_define_it() {
        let line = production(5000, 20_000).line(5000);
        assert!(
            line.starts_with(
                "shape: production, 5000 etcd connections for 5000 machines, deadlines 1 s / 3 s \
                 (fleetd / fleetctl), etcd auth on, 5000 machine roles (+3 shared), etcd TLS on \
                 (client certificates, ECDSA P-256), events on"
            ),
            "{line}"
        );
    }

    #[test]
    fn reads_the_soft_open_file_limit() {
        let limits = "Limit  Soft Limit  Hard Limit  Units\n\
                      Max open files            20000                20000                files\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(20000));
        assert_eq!(soft_limit("", "Max open files"), None);
    }
}
