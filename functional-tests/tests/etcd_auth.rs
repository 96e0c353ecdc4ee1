//! Issue 17 on a real cluster with etcd's authentication on (3 etcd members, 3 machines;
//! `functional_tests::auth`): every fleetd runs as its own host user, fleetctl as the
//! operator. One cluster for every claim, checked in order in one test (a cluster per claim
//! would cost a minute each): start, replace, destroy and reschedule on machine loss work; a
//! viewer lists but cannot start, and the error says why; a host's credentials cannot write
//! another machine's keys, a unit or the leader key; a host without the engine role never
//! leads, even when every engine host is gone (and leads once given the role); root lists the
//! users, reruns the setup and retires a host.

mod support;

use anyhow::{Context, Result, bail, ensure};
use fleet_core::UnitName;
use fleet_functional_tests::auth::{OPERATOR, ROOT, VIEWER};
use fleet_functional_tests::{
    Cluster, ClusterSpec, EtcdAuthSpec, FleetdSpec, OutputExt, TestRegistry, cleanup_stale,
    wait_for,
};
use fleet_registry::Keys;
use fleet_registry::kv::Kv;
use std::time::Duration;
use support::{POLL, PREFIX, sleeper};

/// Starts, moves and leader changes: a few agent TTLs each at most.
const CONVERGE: Duration = Duration::from_secs(60);
/// The port of every machine's TLS API listener (each machine has its own network).
const API_PORT: u16 = 49153;
/// fleetctl's wait for a start: 20 attempts of 2 s, so that a unit that never runs fails the
/// test instead of hanging it.
const BLOCK: &str = "--block-attempts=20";

#[test]
fn with_etcd_auth_on_the_cluster_works_and_each_credential_is_confined() -> Result<()> {
    cleanup_stale()?;
    // m3's fleetd runs an engine, but its user holds its machine role only.
    let auth = EtcdAuthSpec {
        machine_only: vec![3],
    };
    let spec = FleetdSpec::default()
        .with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5")
        .with_api_tls(API_PORT)
        .with_etcd_auth(auth);
    let mut cluster = Cluster::start(ClusterSpec::with_fleetd(3, spec).with_etcd_members(3))?;
    cluster.set_driver(fleet_functional_tests::Driver::Etcd);
    let root = TestRegistry::of(&cluster)?;
    support::wait_registered(&cluster, &root)?;
    let dir = tempdir(&cluster)?;

    a_viewer_lists_but_cannot_start_and_the_error_says_why(&cluster, &root, &dir)?;
    a_host_cannot_write_another_machines_keys_a_unit_or_the_leader_key(&cluster, &root)?;
    start_replace_and_destroy_work_as_the_operator(&cluster, &dir)?;
    status_and_journal_of_a_unit_on_an_agent_only_host_come_from_its_fleetd(&cluster, &dir)?;
    a_unit_moves_off_a_lost_machine(&cluster, &dir)?;
    a_host_without_the_engine_role_never_leads(&cluster, &root)?;
    root_lists_the_users_reruns_setup_and_retires_a_host(&cluster)
}

fn tempdir(cluster: &Cluster) -> Result<std::path::PathBuf> {
    let dir = cluster.dir().join("units");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn write_unit(dir: &std::path::Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

fn a_viewer_lists_but_cannot_start_and_the_error_says_why(
    cluster: &Cluster,
    root: &TestRegistry,
    dir: &std::path::Path,
) -> Result<()> {
    cluster.fleetctl_as(VIEWER, ["list-units"])?.checked()?;
    cluster.fleetctl_as(VIEWER, ["list-machines"])?.checked()?;
    let file = write_unit(dir, "viewed.service", &sleeper(1000))?;
    let out = cluster.fleetctl_as(VIEWER, ["start", "--no-block", &file])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.code() == Some(1), "viewer start: {out:?}");
    // The unit, its file and its file reference go in one transaction; etcd names none, so
    // the message names the first key.
    let unit = Keys::new(PREFIX).unit(&"viewed.service".parse()?);
    ensure!(
        stderr.contains("Error updating viewed.service")
            && stderr.contains(&format!("etcd user '{VIEWER}' may not write {PREFIX}"))
            && stderr.contains("refused by etcd's RBAC: permission denied"),
        "viewer start said: {stderr}"
    );
    ensure!(
        raw_get(root, &unit)?.is_none(),
        "the viewer's unit was written"
    );
    Ok(())
}

fn start_replace_and_destroy_work_as_the_operator(
    cluster: &Cluster,
    dir: &std::path::Path,
) -> Result<()> {
    let file = write_unit(dir, "auth-a.service", &sleeper(1001))?;
    cluster.fleetctl(["start", BLOCK, &file])?.checked()?;
    wait_active(cluster, "auth-a.service")?;
    let before = unit_hash(cluster, "auth-a.service")?;
    write_unit(dir, "auth-a.service", &sleeper(1002))?;
    cluster
        .fleetctl(["start", BLOCK, "--replace", &file])?
        .checked()?;
    ensure!(
        unit_hash(cluster, "auth-a.service")? != before,
        "start --replace kept the old file"
    );
    wait_active(cluster, "auth-a.service")?;
    cluster.fleetctl(["destroy", "auth-a.service"])?.checked()?;
    wait_for(CONVERGE, POLL, || {
        list_units(cluster).is_ok_and(|rows| !rows.iter().any(|(u, _, _)| u == "auth-a.service"))
    })
    .context("destroyed unit still listed")
}

/// Issue 37: on an agent-only host (m3: its machine role only, as docs/deploy.md sets hosts
/// up) the fleetd serving a unit's status and journal reads nothing but its own schedule. The
/// operator's fleetctl over etcd gets both from m3's fleetd over its TLS API, with the API's
/// own files beside etcd's credentials.
fn status_and_journal_of_a_unit_on_an_agent_only_host_come_from_its_fleetd(
    cluster: &Cluster,
    dir: &std::path::Path,
) -> Result<()> {
    let m3 = cluster.machine("m3")?;
    let text = format!(
        "[Service]\nExecStart=/bin/bash -c 'while true; do echo auth-tick; sleep 0.5; done'\n\n\
         [X-Fleet]\nMachineID={}\n",
        m3.id()
    );
    let file = write_unit(dir, "auth-s.service", &text)?;
    cluster.fleetctl(["start", BLOCK, &file])?.checked()?;
    wait_active(cluster, "auth-s.service")?;
    let certs = cluster.api_certs().context("no API certificates")?;
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let api = [
        "--api-ca-file".as_ref(),
        ca.as_os_str(),
        "--api-cert-file".as_ref(),
        cert.as_os_str(),
        "--api-key-file".as_ref(),
        key.as_os_str(),
    ];
    let with = |more: &[&str]| -> Result<String> {
        let args = api.iter().copied().chain(more.iter().map(|a| a.as_ref()));
        cluster.fleetctl(args)?.checked()
    };
    let status = with(&["status", "auth-s.service"])?;
    ensure!(status.contains("Active: active (running)"), "{status}");
    let mut last = String::new();
    wait_for(CONVERGE, POLL, || {
        last = with(&["journal", "--lines", "5", "auth-s.service"]).unwrap_or_default();
        last.contains("auth-tick")
    })
    .with_context(|| format!("journal from m3's fleetd: {last}"))?;
    cluster.fleetctl(["destroy", "auth-s.service"])?.checked()?;
    Ok(())
}

/// Each write of machine 3's user (its machine role only: an engine host is trusted with
/// every schedule, a host whose API writes with units) to machine 1's schedule, state and presence, to a unit and to the leader key is
/// refused, and the key (read as root) is as it was.
fn a_host_cannot_write_another_machines_keys_a_unit_or_the_leader_key(
    cluster: &Cluster,
    root: &TestRegistry,
) -> Result<()> {
    let m1 = cluster.machine("m1")?.id().clone();
    let m3 = cluster.machine("m3")?.id().clone();
    let host = TestRegistry::connect_as(
        &cluster.etcd_endpoint(),
        PREFIX,
        Some(fleet_functional_tests::auth::host_credentials(&m3)),
    )?;
    let keys = Keys::new(PREFIX);
    let unit: UnitName = "auth-a.service".parse()?;
    for key in [
        keys.schedule(&m1, &unit),
        keys.state(&m1, &unit),
        keys.machine(&m1),
        keys.unit(&unit),
        keys.leader(),
    ] {
        let before = raw_get(root, &key)?;
        let put = host.put_raw(&key, b"{}");
        let delete = host.delete_raw(&key);
        for (what, res) in [("put", put), ("delete", delete)] {
            let e = match res {
                Ok(()) => bail!("{what} of {key} as machine 3's user was accepted"),
                Err(e) => format!("{e:#}"),
            };
            ensure!(e.contains("permission denied"), "{what} {key}: {e}");
        }
        ensure!(raw_get(root, &key)? == before, "{key} changed");
    }
    Ok(())
}

fn a_unit_moves_off_a_lost_machine(cluster: &Cluster, dir: &std::path::Path) -> Result<()> {
    let file = write_unit(dir, "auth-b.service", &sleeper(1003))?;
    cluster.fleetctl(["start", BLOCK, &file])?.checked()?;
    let first = wait_active(cluster, "auth-b.service")?;
    let lost = cluster.machine_by_id(&first)?;
    lost.stop_fleetd()?;
    wait_for(CONVERGE, POLL, || {
        list_units(cluster).is_ok_and(|rows| {
            rows.iter()
                .any(|(u, m, a)| u == "auth-b.service" && m != &first && a == "active")
        })
    })
    .context("auth-b.service did not move off its lost machine")?;
    lost.start_fleetd()
}

/// m3's engine campaigns, is refused and says so; with every engine host's fleetd stopped
/// and the leader key gone, it still does not lead. Given the engine role, it leads: it was
/// campaigning all along (fleetd logs how many refusals came before).
fn a_host_without_the_engine_role_never_leads(
    cluster: &Cluster,
    root: &TestRegistry,
) -> Result<()> {
    let keys = Keys::new(PREFIX);
    let m3 = cluster.machine("m3")?;
    // Said by the fleetd running now: m3 may be the machine whose fleetd the test before
    // stopped and started again, and a refusal of its old process proves nothing of the new.
    wait_for(CONVERGE, POLL, || {
        let Ok(Some(pid)) = m3.main_pid("fleet.service") else {
            return false;
        };
        m3.journal(&[&format!("_PID={pid}"), "-o", "cat"])
            .is_ok_and(|j| j.contains("may not campaign for engine leadership"))
    })
    .context("m3 never said that it may not campaign")?;
    for name in ["m1", "m2"] {
        cluster.machine(name)?.stop_fleetd()?;
    }
    wait_for(CONVERGE, POLL, || {
        raw_get(root, &keys.leader()).is_ok_and(|v| v.is_none())
    })
    .context("the leader key outlived every engine host")?;
    let cursor = support::journal_cursor(m3)?;
    fleet_functional_tests::auth::set_full_roles(cluster.state(), m3.id(), true)?;
    let m3_id = m3.id().to_string();
    // The engine's backoff after refusals is at most a minute.
    wait_for(Duration::from_secs(90), POLL, || {
        raw_get(root, &keys.leader())
            .is_ok_and(|v| v.is_some_and(|v| String::from_utf8_lossy(&v).contains(&m3_id)))
    })
    .context("m3 did not lead once given the engine role")?;
    let log = support::fleetd_log(m3, &cursor)?;
    ensure!(
        log.contains("engine leadership acquired"),
        "m3's log after the grant: {log}"
    );
    // The count of refusals is logged by the first campaign etcd lets through, which may be
    // one that found another engine leading (before the grant, while m1 or m2 led).
    let all = support::fleetd_log_all(m3)?;
    ensure!(
        all.contains("engine campaign permitted again by etcd"),
        "m3 never logged its refusals' end: {all}"
    );
    Ok(())
}

/// `auth list` names every user with its roles; `auth setup` again changes nothing and
/// succeeds; `auth remove-host` retires m3's user, whose credentials are then refused.
fn root_lists_the_users_reruns_setup_and_retires_a_host(cluster: &Cluster) -> Result<()> {
    let m3 = cluster.machine("m3")?.id().clone();
    let host = fleet_registry::rbac::host_user_name(&m3);
    let list = cluster.fleetctl_as(ROOT, ["auth", "list"])?.checked()?;
    for line in [
        format!("{OPERATOR}\tfleet-operator"),
        format!("{VIEWER}\tfleet-viewer"),
    ] {
        ensure!(list.lines().any(|l| l == line), "{line:?} in {list}");
    }
    ensure!(list.contains(&host), "{host} in {list}");
    let again = cluster.fleetctl_as(ROOT, ["auth", "setup"])?.checked()?;
    ensure!(again.lines().count() == 3, "setup again: {again}");
    cluster
        .fleetctl_as(ROOT, ["auth", "remove-host", m3.as_str()])?
        .checked()?;
    let list = cluster.fleetctl_as(ROOT, ["auth", "list"])?.checked()?;
    ensure!(!list.contains(&host), "{host} still in {list}");
    let retired = TestRegistry::connect_as(
        &cluster.etcd_endpoint(),
        PREFIX,
        Some(fleet_functional_tests::auth::host_credentials(&m3)),
    )?;
    let e = match retired.machine_ids() {
        Ok(ids) => bail!("a removed host's user still reads: {ids:?}"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(e.contains("refused the credentials"), "{e}");
    Ok(())
}

fn raw_get(reg: &TestRegistry, key: &str) -> Result<Option<Vec<u8>>> {
    let res = reg.block_on(reg.registry().raw_kv().range(key, false, None))?;
    Ok(res.kvs.into_iter().next().map(|kv| kv.value))
}

/// `(unit, full machine ID, active)` rows of `list-units`.
fn list_units(cluster: &Cluster) -> Result<Vec<(String, String, String)>> {
    let out = cluster
        .fleetctl([
            "list-units",
            "--no-legend",
            "-l",
            "--fields=unit,machine,active",
        ])?
        .checked()?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (u, m, a) = (f.next()?, f.next()?, f.next()?);
            let m = m.split('/').next().unwrap_or(m);
            Some((u.to_owned(), m.to_owned(), a.to_owned()))
        })
        .collect())
}

/// Waits until `unit` is active somewhere; its machine's ID.
fn wait_active(cluster: &Cluster, unit: &str) -> Result<String> {
    fleet_functional_tests::wait_for_value(CONVERGE, POLL, || {
        list_units(cluster).ok().and_then(|rows| {
            rows.into_iter()
                .find(|(u, _, a)| u == unit && a == "active")
                .map(|(_, m, _)| m)
        })
    })
    .with_context(|| format!("{unit} never became active"))
}

fn unit_hash(cluster: &Cluster, unit: &str) -> Result<String> {
    let out = cluster
        .fleetctl(["list-unit-files", "--no-legend", "-l", "--fields=unit,hash"])?
        .checked()?;
    out.lines()
        .filter_map(|l| l.split_once(char::is_whitespace))
        .find(|(u, _)| *u == unit)
        .map(|(_, h)| h.trim().to_owned())
        .with_context(|| format!("{unit} not in list-unit-files"))
}
