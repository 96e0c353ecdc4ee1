//! Transport security end to end (promise 6 of `docs/guarantees.md`): an etcd that serves
//! clients only over TLS and only with a client certificate of its own authority, all made by
//! the test (`openssl`); fleetd in a machine (`FLEET_ETCD_CAFILE/CERTFILE/KEYFILE`, an https
//! `etcd_servers`) and fleetctl on the host (`--ca-file --cert-file --key-file`) work through
//! it, and with a wrong CA both refuse the server with a clear error. Needs root.
//!
//! The harness's own etcd is plain HTTP; the TLS one listens on the cluster's bridge address,
//! which the machines reach, and the machines' fleetd are pointed at it by an environment
//! drop-in.

mod support;

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{Cluster, FleetdSpec, Machine, wait_for, wait_for_value};
use fleet_registry::{DEFAULT_PREFIX, Registry};
use fleet_testing::{TestCerts, TestEtcd};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use support::{POLL, TIMEOUT, fleetd_log, journal_cursor, sleeper, start, write_units};

/// Where the certificates go inside a machine.
const MACHINE_TLS_DIR: &str = "/run/fleet/tls";

/// The cluster's bridge address (where its etcd listens for the machines).
fn bridge_ip(cluster: &Cluster) -> Result<Ipv4Addr> {
    let endpoint = cluster.etcd_endpoint();
    let host = endpoint
        .strip_prefix("http://")
        .and_then(|rest| rest.split(':').next())
        .with_context(|| format!("no host in {endpoint}"))?;
    Ok(host.parse()?)
}

/// Points `machine`'s fleetd at `endpoint` with the given CA and the test's client
/// certificate, and restarts it.
fn use_tls_etcd(machine: &Machine, certs: &TestCerts, endpoint: &str, ca: &Path) -> Result<()> {
    machine.stop_fleetd()?;
    for (name, path) in [
        ("ca.pem", ca.to_path_buf()),
        ("client.pem", certs.client_cert()),
        ("client.key", certs.client_key()),
    ] {
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        machine.write_file(&format!("{MACHINE_TLS_DIR}/{name}"), bytes)?;
    }
    // fleetd refuses a private key others may read (issue 37).
    machine.sh(&format!("chmod 0600 {MACHINE_TLS_DIR}/client.key"))?;
    machine.write_file(
        "/run/fleet/tls.env",
        format!(
            "FLEET_ETCD_SERVERS={endpoint}\n\
             FLEET_ETCD_CAFILE={MACHINE_TLS_DIR}/ca.pem\n\
             FLEET_ETCD_CERTFILE={MACHINE_TLS_DIR}/client.pem\n\
             FLEET_ETCD_KEYFILE={MACHINE_TLS_DIR}/client.key\n"
        ),
    )?;
    // A later EnvironmentFile= wins over the harness's.
    machine.write_file(
        "/run/systemd/system/fleet.service.d/tls.conf",
        "[Service]\nEnvironmentFile=/run/fleet/tls.env\n",
    )?;
    machine.systemctl_ok(&["daemon-reload"])?;
    machine.start_fleetd()
}

/// `fleetctl` on the host against etcd at `endpoint` with `tls` flags (the driver named: a
/// port other than 2379 or 4001 would make fleetctl take it for an API).
fn fleetctl_tls(
    cluster: &Cluster,
    endpoint: &str,
    tls: &[&str],
    args: &[&str],
) -> Result<support::Run> {
    let out = Command::new(cluster.fleetctl_path())
        .args([
            "--driver",
            "etcd",
            "--endpoint",
            endpoint,
            "--request-timeout",
            "2",
        ])
        .args(tls)
        .args(args)
        .env_remove("FLEETCTL_ENDPOINT")
        .output()
        .context("running fleetctl")?;
    Ok(support::Run {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[test]
fn fleetd_and_fleetctl_work_over_tls_with_client_certificates_and_refuse_a_wrong_ca() -> Result<()>
{
    let spec = FleetdSpec::default().with_env("FLEET_ENGINE_RECONCILE_INTERVAL", "0.5");
    let (cluster, _plain) = start(2, spec)?;
    let [good, bad] = cluster.machines() else {
        unreachable!()
    };
    let bridge = bridge_ip(&cluster)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let certs = TestCerts::generate(&[IpAddr::V4(bridge), IpAddr::V4(Ipv4Addr::LOCALHOST)]);
    let etcd = runtime.block_on(TestEtcd::start_tls(&certs, IpAddr::V4(bridge)));
    let endpoint = etcd.endpoint();
    let registry = Registry::new(runtime.block_on(etcd.kv()), DEFAULT_PREFIX);

    let bad_cursor = journal_cursor(bad)?;
    use_tls_etcd(good, &certs, &endpoint, &certs.ca())?;
    use_tls_etcd(bad, &certs, &endpoint, &certs.wrong_ca())?;

    // fleetd with the right CA registers over TLS; with the wrong one it refuses the server,
    // says why, and never registers.
    wait_for(TIMEOUT, POLL, || {
        runtime
            .block_on(registry.machines())
            .is_ok_and(|ms| ms.items.iter().any(|m| &m.id == good.id()))
    })
    .context("fleetd did not register over TLS")?;
    let refusal = wait_for_value(TIMEOUT, POLL, || {
        let log = fleetd_log(bad, &bad_cursor).ok()?;
        log.lines()
            .find(|l| l.contains("invalid peer certificate: UnknownIssuer"))
            .map(str::to_owned)
    })
    .with_context(|| {
        format!(
            "fleetd with a wrong CA did not say why it cannot reach etcd; its log:\n{}",
            fleetd_log(bad, &bad_cursor).unwrap_or_default()
        )
    })?;
    ensure!(refusal.contains(&endpoint), "{refusal}");
    let machines = runtime.block_on(registry.machines())?;
    ensure!(
        machines.items.iter().all(|m| &m.id != bad.id()),
        "a fleetd trusting the wrong CA registered: {machines:?}"
    );

    // fleetctl over TLS: it lists the machine and starts a unit, which the TLS fleetd runs.
    let ca = certs.ca().display().to_string();
    let cert = certs.client_cert().display().to_string();
    let key = certs.client_key().display().to_string();
    let flags = ["--ca-file", &ca, "--cert-file", &cert, "--key-file", &key];
    let listed = fleetctl_tls(
        &cluster,
        &endpoint,
        &flags,
        &["list-machines", "--full", "--no-legend"],
    )?;
    ensure!(listed.success, "{listed:?}");
    ensure!(
        listed.stdout.contains(good.id().as_str()) && !listed.stdout.contains(bad.id().as_str()),
        "{listed:?}"
    );
    let texts = [("secure.service".to_owned(), sleeper(950_000))].into();
    let paths = write_units(&cluster.dir().join("units"), &texts)?;
    let started = fleetctl_tls(
        &cluster,
        &endpoint,
        &flags,
        &[
            "start",
            "--block-attempts",
            "10",
            paths["secure.service"].as_str(),
        ],
    )?;
    ensure!(started.success, "{started:?}");
    ensure!(
        good.main_pid("secure.service")?.is_some(),
        "secure.service does not run on {}",
        good.name()
    );

    // With a wrong CA, or without a client certificate, fleetctl fails at once, saying why.
    let wrong = certs.wrong_ca().display().to_string();
    let wrong_flags = [
        "--ca-file",
        &wrong,
        "--cert-file",
        &cert,
        "--key-file",
        &key,
    ];
    let began = Instant::now();
    let refused = fleetctl_tls(&cluster, &endpoint, &wrong_flags, &["list-units"])?;
    ensure!(
        began.elapsed() < Duration::from_secs(10),
        "took {:?}",
        began.elapsed()
    );
    ensure!(
        !refused.success
            && refused
                .stderr
                .contains("invalid peer certificate: UnknownIssuer")
            && refused.stderr.contains(&endpoint)
            && refused.stdout.is_empty(),
        "{refused:?}"
    );
    let no_cert = fleetctl_tls(&cluster, &endpoint, &["--ca-file", &ca], &["list-units"])?;
    ensure!(
        !no_cert.success
            && no_cert
                .stderr
                .contains("no TLS client certificate is configured"),
        "{no_cert:?}"
    );
    let plain = fleetctl_tls(
        &cluster,
        &endpoint.replace("https://", "http://"),
        &[],
        &["list-units"],
    )?;
    ensure!(
        !plain.success
            && plain
                .stderr
                .contains(&endpoint.replace("https://", "http://")),
        "{plain:?}"
    );

    // The misconfigured machine recovers once given the right CA.
    use_tls_etcd(bad, &certs, &endpoint, &certs.ca())?;
    wait_for(TIMEOUT, POLL, || {
        runtime
            .block_on(registry.machines())
            .is_ok_and(|ms| ms.items.iter().any(|m| &m.id == bad.id()))
    })
    .context("fleetd did not register once given the right CA")?;

    drop(registry);
    drop(etcd);
    support::finish(cluster)
}
