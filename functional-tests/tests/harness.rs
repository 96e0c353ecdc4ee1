//! The harness itself, on bare machines (no fleetd): machines boot to `running` with a system
//! bus, are isolated from each other and from the host, reach etcd until cut off, and leave
//! nothing behind. Needs root.

use anyhow::{Context, Result};
use fleet_functional_tests::{
    Cluster, ClusterSpec, ClusterState, FleetdSpec, Machine, OutputExt, ProcId, Signal,
    cleanup_stale, functional_dir, leftovers, wait_for, wait_for_value,
};
use std::path::PathBuf;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);

fn start(spec: ClusterSpec) -> Result<Cluster> {
    cleanup_stale()?;
    Cluster::start(spec)
}

/// A file in the host's /tmp that a machine booting without a private /tmp would delete.
struct TmpMarker(PathBuf);

impl TmpMarker {
    fn new(test: &str) -> TmpMarker {
        let path = PathBuf::from(format!(
            "/tmp/fleet-functional-marker-{test}-{}",
            std::process::id()
        ));
        std::fs::write(&path, "keep me").unwrap();
        TmpMarker(path)
    }

    fn survived(&self) -> bool {
        std::fs::read_to_string(&self.0).is_ok_and(|s| s == "keep me")
    }
}

impl Drop for TmpMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn etcdctl(machine: &Machine, endpoint: &str, args: &[&str]) -> Result<String> {
    let endpoints = format!("--endpoints={endpoint}");
    let mut all = vec![
        endpoints.as_str(),
        "--dial-timeout=500ms",
        "--command-timeout=1s",
    ];
    all.extend(args);
    machine
        .exec("etcdctl", &all)?
        .checked()
        .with_context(|| format!("etcdctl {args:?} in {}", machine.name()))
}

fn start_hello(machine: &Machine, unit: &str) -> Result<u32> {
    machine.write_file(
        &format!("/run/systemd/system/{unit}"),
        "[Service]\nExecStart=/bin/sleep infinity\n",
    )?;
    machine.systemctl_ok(&["daemon-reload"])?;
    machine.systemctl_ok(&["start", unit])?;
    machine.main_pid(unit)?.context("unit has no main PID")
}

#[test]
fn machines_boot_to_running_with_their_own_identity_and_system_bus() -> Result<()> {
    let marker = TmpMarker::new("identity");
    let cluster = start(ClusterSpec::bare(3))?;
    let mut ids = Vec::new();
    for machine in cluster.machines() {
        assert_eq!(
            machine.systemctl_ok(&["is-system-running"])?.trim(),
            "running"
        );
        assert_eq!(machine.sh("hostname")?.trim(), machine.name());
        assert_eq!(
            machine.read_file("/etc/machine-id")?.trim(),
            machine.id().as_str()
        );
        let bus = machine
            .exec("busctl", ["--system", "--no-pager", "list"])?
            .checked()?;
        assert!(bus.contains("org.freedesktop.systemd1"), "{bus}");
        let addresses = machine.sh("ip -4 -o address show dev eth0")?;
        assert!(
            addresses.contains(&format!("{}/24", machine.ip())),
            "{addresses}"
        );
        ids.push(machine.id().clone());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "machine IDs must differ");
    // The host's root filesystem is read-only inside; the private tmpfs mounts are not.
    let m1 = &cluster.machines()[0];
    assert!(m1.sh("touch /etc/fleet-test-should-fail").is_err());
    m1.sh("touch /tmp/x /run/x /var/tmp/x")?;
    assert!(
        marker.survived(),
        "the host's /tmp was touched by a booting machine"
    );
    Ok(())
}

#[test]
fn a_unit_on_one_machine_is_invisible_on_another() -> Result<()> {
    let marker = TmpMarker::new("isolation");
    let cluster = start(ClusterSpec::bare(2))?;
    let [m1, m2] = cluster.machines() else {
        unreachable!()
    };
    // The same unit name on both machines: distinct processes in distinct cgroups.
    let pid_on_m1 = start_hello(m1, "hello.service")?;
    let pid_on_m2 = start_hello(m2, "hello.service")?;
    let cgroup = |m: &Machine| {
        m.systemctl_ok(&[
            "show",
            "--property=ControlGroup",
            "--value",
            "hello.service",
        ])
    };
    let (cg1, cg2) = (cgroup(m1)?, cgroup(m2)?);
    assert_ne!(cg1, cg2);
    let host_pids = |cg: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/systemd{}/cgroup.procs", cg.trim()))
            .unwrap()
    };
    let (procs1, procs2) = (host_pids(&cg1), host_pids(&cg2));
    assert_eq!(procs1.lines().count(), 1, "{cg1}: {procs1}");
    assert_eq!(procs2.lines().count(), 1, "{cg2}: {procs2}");
    assert_ne!(procs1, procs2);
    // Each machine numbers its own processes.
    assert!(
        pid_on_m1 < 1000 && pid_on_m2 < 1000,
        "{pid_on_m1} {pid_on_m2}"
    );

    start_hello(m1, "only-m1.service")?;
    assert_eq!(
        m1.systemctl_ok(&["is-active", "only-m1.service"])?.trim(),
        "active"
    );
    let on_m2 = m2.systemctl(["show", "--property=LoadState", "--value", "only-m1.service"])?;
    assert_eq!(on_m2.checked()?.trim(), "not-found");
    // m2's /proc shows its own processes only: its one hello.service sleep.
    let sleeps = "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep";
    assert_eq!(m2.sh(sleeps)?.trim(), "1");
    assert!(marker.survived());
    Ok(())
}

#[test]
fn machines_reach_etcd_until_their_network_is_cut() -> Result<()> {
    let cluster = start(ClusterSpec::bare(2))?;
    let endpoint = cluster.etcd_endpoint();
    let [m1, m2] = cluster.machines() else {
        unreachable!()
    };
    etcdctl(m1, &endpoint, &["put", "/harness/k", "from-m1"])?;
    assert_eq!(
        etcdctl(m2, &endpoint, &["get", "--print-value-only", "/harness/k"])?.trim(),
        "from-m1"
    );

    m1.cut_network()?;
    assert!(etcdctl(m1, &endpoint, &["get", "/harness/k"]).is_err());
    etcdctl(m2, &endpoint, &["put", "/harness/k", "from-m2"])?;

    m1.heal_network()?;
    let value = wait_for_value(TIMEOUT, POLL, || {
        etcdctl(m1, &endpoint, &["get", "--print-value-only", "/harness/k"]).ok()
    })?;
    assert_eq!(value.trim(), "from-m2");
    Ok(())
}

#[test]
fn etcd_keeps_its_data_across_a_restart() -> Result<()> {
    let mut cluster = start(ClusterSpec::bare(1))?;
    let endpoint = cluster.etcd_endpoint();
    let m1 = &cluster.machines()[0];
    etcdctl(m1, &endpoint, &["put", "/harness/durable", "yes"])?;
    cluster.stop_etcd()?;
    let m1 = &cluster.machines()[0];
    assert!(etcdctl(m1, &endpoint, &["get", "/harness/durable"]).is_err());
    cluster.start_etcd()?;
    assert_eq!(cluster.etcd_endpoint(), endpoint);
    let m1 = &cluster.machines()[0];
    assert_eq!(
        etcdctl(
            m1,
            &endpoint,
            &["get", "--print-value-only", "/harness/durable"]
        )?
        .trim(),
        "yes"
    );
    Ok(())
}

#[test]
fn a_three_member_etcd_replicates_survives_a_member_kill_and_is_cleaned_up_by_names() -> Result<()>
{
    let mut cluster = start(ClusterSpec::bare(1).with_etcd_members(3))?;
    let endpoints = cluster.etcd_endpoints();
    assert_eq!(endpoints.len(), 3);
    assert_eq!(cluster.etcd_endpoint(), endpoints.join(","));
    let m1 = &cluster.machines()[0];
    etcdctl(m1, &endpoints[0], &["put", "/harness/replicated", "yes"])?;
    let read = |cluster: &Cluster, endpoint: &str| -> Result<String> {
        let m1 = &cluster.machines()[0];
        let args = ["get", "--print-value-only", "/harness/replicated"];
        Ok(etcdctl(m1, endpoint, &args)?.trim().to_owned())
    };
    assert_eq!(read(&cluster, &endpoints[2])?, "yes");

    cluster.make_etcd_leader(0)?;
    cluster.kill_etcd_member(0)?;
    assert_ne!(cluster.etcd_leader()?, 0);
    assert_eq!(read(&cluster, &endpoints[1])?, "yes");
    cluster.start_etcd_member(0)?;
    assert!(cluster.etcd_healthy());
    assert_eq!(read(&cluster, &endpoints[0])?, "yes");

    let state = cluster.state().clone();
    assert_eq!(state.etcd.processes().len(), 3);
    cluster.detach()?;
    // Only the names are left to find the members by (`flt<id>`, `flt<id>e1`, `flt<id>e2`).
    std::fs::remove_dir_all(&state.dir)?;
    cleaned_up(&state)
}

#[test]
fn a_powered_off_machine_is_gone_and_a_new_one_can_join() -> Result<()> {
    let mut cluster = start(ClusterSpec::bare(2))?;
    let m1 = &cluster.machines()[0];
    m1.poweroff()?;
    assert!(!m1.is_up());
    assert!(m1.exec("true", [] as [&str; 0]).is_err());
    assert_eq!(
        cluster.machines()[1]
            .systemctl_ok(&["is-system-running"])?
            .trim(),
        "running"
    );
    cluster.add_machine()?;
    let m3 = cluster.machine("m3")?;
    assert_ne!(m3.id(), cluster.machines()[0].id());
    assert_eq!(m3.sh("hostname")?.trim(), "m3");
    assert_eq!(cluster.machine_by_id(m3.id().short())?.name(), "m3");
    Ok(())
}

#[test]
fn teardown_leaves_nothing_behind() -> Result<()> {
    let cluster = start(ClusterSpec::bare(2))?;
    start_hello(&cluster.machines()[0], "hello.service")?;
    let state = cluster.state().clone();
    assert!(
        !leftovers(&state)?.is_empty(),
        "a running cluster must show up"
    );
    drop(cluster);
    assert_eq!(leftovers(&state)?, Vec::<String>::new());
    assert!(state.dir.join("cluster.down.json").exists());
    assert!(!state.dir.join("etcd").exists(), "etcd's data is deleted");
    Ok(())
}

/// Cleans up until nothing of `state` is left. Any process running tests here may be the one
/// that actually cleans (they all call `cleanup_stale`), so this waits instead of asserting on
/// one call's report.
fn cleaned_up(state: &ClusterState) -> Result<()> {
    wait_for(TIMEOUT, POLL, || {
        let _ = cleanup_stale();
        leftovers(state).is_ok_and(|l| l.is_empty())
    })
    .with_context(|| format!("left over: {:?}", leftovers(state)))
}

#[test]
fn a_cluster_abandoned_by_a_dead_owner_is_cleaned_up_later() -> Result<()> {
    let cluster = start(ClusterSpec::bare(1))?;
    let mut state = cluster.state().clone();
    // Pretend the owner died: hand the cluster to a process that no longer exists.
    cluster.detach()?;
    state.owner = Some(ProcId {
        pid: 1,
        start_time: u64::MAX,
    });
    state.save()?;
    cleaned_up(&state)?;
    wait_for(TIMEOUT, POLL, || {
        state.dir.join("cluster.down.json").exists()
    })?;
    Ok(())
}

#[test]
fn a_cluster_whose_state_file_is_lost_is_found_by_its_names() -> Result<()> {
    let cluster = start(ClusterSpec::bare(1))?;
    let state = cluster.state().clone();
    cluster.detach()?;
    // As after `cargo clean` under a running cluster: only the resources' names are left.
    std::fs::remove_dir_all(&state.dir)?;
    cleaned_up(&state)
}

#[test]
fn a_panicking_test_still_tears_its_cluster_down() -> Result<()> {
    let started = std::sync::Mutex::new(None);
    let result = std::panic::catch_unwind(|| {
        let cluster = start(ClusterSpec::bare(1)).unwrap();
        *started.lock().unwrap() = Some(cluster.state().clone());
        panic!("a failing test");
    });
    assert!(result.is_err());
    let state = started
        .into_inner()
        .unwrap()
        .context("cluster did not start")?;
    assert_eq!(leftovers(&state)?, Vec::<String>::new());
    Ok(())
}

/// A stand-in fleetd (a shell script) proves the wiring: unit, environment file, read-only
/// binary mount, restart on failure, and fleetctl's command line.
#[test]
fn fleetd_runs_as_a_service_with_the_cluster_environment() -> Result<()> {
    let bin_dir = functional_dir().join(format!("fake-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin_dir)?;
    let script = |name: &str, body: &str| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let path = bin_dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    };
    script("fleetd", "env | grep ^FLEET_ | sort; exec sleep infinity")?;
    script("fleetctl", "echo \"$@\"")?;
    let spec = FleetdSpec {
        bin_dir: bin_dir.clone(),
        ..FleetdSpec::default()
    }
    .with_env("FLEET_ETCD_KEY_PREFIX", "/fleet-test");
    let cluster = start(ClusterSpec::with_fleetd(2, spec))?;
    let endpoint = cluster.etcd_endpoint();
    for machine in cluster.machines() {
        let env = wait_for_value(TIMEOUT, POLL, || {
            let log = machine
                .journal(&["-u", "fleet.service", "-o", "cat"])
                .ok()?;
            log.contains("FLEET_PUBLIC_IP").then_some(log)
        })?;
        assert!(
            env.contains(&format!("FLEET_ETCD_SERVERS={endpoint}")),
            "{env}"
        );
        assert!(
            env.contains(&format!("FLEET_PUBLIC_IP={}", machine.ip())),
            "{env}"
        );
        assert!(
            env.contains(&format!("FLEET_METADATA=hostname={}", machine.name())),
            "{env}"
        );
        assert!(env.contains("FLEET_AGENT_TTL=3s"), "{env}");
        assert!(env.contains("FLEET_ETCD_KEY_PREFIX=/fleet-test"), "{env}");
        assert!(
            machine.sh("touch /opt/fleet/bin/x").is_err(),
            "binaries are read-only"
        );
    }
    let m1 = &cluster.machines()[0];
    let first = m1
        .main_pid("fleet.service")?
        .context("fleetd not running")?;
    m1.kill_fleetd(Signal::Kill)?;
    wait_for(TIMEOUT, POLL, || {
        m1.main_pid("fleet.service")
            .ok()
            .flatten()
            .is_some_and(|pid| pid != first)
    })
    .context("fleetd was not restarted after SIGKILL")?;
    m1.stop_fleetd()?;
    assert_eq!(
        m1.systemctl(["is-active", "fleet.service"])?
            .stdout_text()
            .trim(),
        "inactive"
    );
    m1.restart_fleetd()?;
    assert!(m1.main_pid("fleet.service")?.is_some());

    let out = cluster.fleetctl(["list-machines"])?.checked()?;
    assert_eq!(out.trim(), format!("--endpoint {endpoint} list-machines"));
    drop(cluster);
    std::fs::remove_dir_all(bin_dir)?;
    Ok(())
}

/// Removes a directory the test made outside the run directories, also when it fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A checkout may be anywhere: below /var/tmp or /tmp, which every machine gets a fresh tmpfs
/// on, or below a path with a space. The run directory (identity files, units) and the bin dir
/// are both there, and the machine must still boot and run fleetd from them.
#[test]
fn machines_boot_from_a_checkout_below_var_tmp_or_tmp() -> Result<()> {
    for parent in ["/var/tmp", "/tmp"] {
        let scratch = Scratch(PathBuf::from(format!(
            "{parent}/fleet functional {}",
            std::process::id()
        )));
        let bin_dir = scratch.0.join("bin");
        std::fs::create_dir_all(&bin_dir)?;
        {
            use std::os::unix::fs::PermissionsExt;
            let fleetd = bin_dir.join("fleetd");
            std::fs::write(
                &fleetd,
                "#!/bin/sh\necho fleetd-from-scratch\nexec sleep infinity\n",
            )?;
            std::fs::set_permissions(&fleetd, std::fs::Permissions::from_mode(0o755))?;
        }
        let spec = ClusterSpec {
            dir: Some(scratch.0.join("run")),
            ..ClusterSpec::with_fleetd(
                1,
                FleetdSpec {
                    bin_dir: bin_dir.clone(),
                    ..FleetdSpec::default()
                },
            )
        };
        let cluster = start(spec).with_context(|| format!("a cluster below {parent}"))?;
        let m1 = &cluster.machines()[0];
        let hostname = m1.sh("cat /etc/hostname")?;
        assert_eq!(hostname.trim(), "m1", "below {parent}");
        wait_for(TIMEOUT, POLL, || {
            m1.journal(&["-u", "fleet.service", "-o", "cat"])
                .is_ok_and(|log| log.contains("fleetd-from-scratch"))
        })
        .with_context(|| format!("fleetd from a bin dir below {parent}"))?;
        drop(cluster);
    }
    Ok(())
}
