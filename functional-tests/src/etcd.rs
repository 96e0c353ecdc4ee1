//! The cluster's etcd: one real `/usr/bin/etcd` member on the host, listening on 127.0.0.1 and
//! on the bridge address, so the host (fleetctl, tests) and every machine (fleetd) reach it.
//! Its data survives `stop`/`start`, which tests use to simulate an etcd outage.

use crate::proc::ProcId;
use crate::state::{ClusterState, bridge_ip};
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a fresh or restarted etcd may take to answer `/health`.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(15);

pub fn data_dir(state: &ClusterState) -> PathBuf {
    state.dir.join("etcd")
}

pub fn log_file(state: &ClusterState) -> PathBuf {
    state.dir.join("etcd.log")
}

/// A TCP port nobody listens on right now (on any address).
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("0.0.0.0:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Starts etcd as recorded in `state` (ports, subnet) and waits until it is healthy.
/// `setsid`: it must outlive a detached `fleet-cluster up` and not get the terminal's signals.
pub fn start(state: &ClusterState) -> Result<(Child, ProcId)> {
    let subnet = state.subnet.context("etcd needs the cluster's subnet")?;
    let name = state.bridge.as_str();
    let client = |host: String| format!("http://{host}:{}", state.etcd.client_port);
    let peer = format!("http://127.0.0.1:{}", state.etcd.peer_port);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_file(state))
        .context("cannot open etcd's log")?;
    let mut child = Command::new("setsid")
        .arg("/usr/bin/etcd")
        .args(["--name", name])
        .arg("--data-dir")
        .arg(data_dir(state))
        .args([
            "--listen-client-urls",
            &format!(
                "{},{}",
                client("127.0.0.1".into()),
                client(bridge_ip(subnet).to_string())
            ),
            "--advertise-client-urls",
            &client(bridge_ip(subnet).to_string()),
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
            "--initial-cluster",
            &format!("{name}={peer}"),
            "--logger=zap",
            // Fast elections: a single member is leader ~0.1 s after start (1.2 s by default).
            "--heartbeat-interval=10",
            "--election-timeout=100",
        ])
        .current_dir(&state.dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start /usr/bin/etcd")?;
    let process = ProcId::of(child.id())?;
    let addr = SocketAddr::from((bridge_ip(subnet), state.etcd.client_port));
    let healthy = crate::wait_for(HEALTH_TIMEOUT, Duration::from_millis(20), || {
        is_healthy(addr) || matches!(child.try_wait(), Ok(Some(_)))
    });
    if let Ok(Some(status)) = child.try_wait() {
        bail!(
            "etcd exited with {status} at start; see {}",
            log_file(state).display()
        );
    }
    if let Err(e) = healthy {
        let _ = process.kill_and_wait(Duration::from_secs(5));
        let _ = child.wait();
        return Err(e).context(format!(
            "etcd not healthy; see {}",
            log_file(state).display()
        ));
    }
    Ok((child, process))
}

/// `GET /health` answers `{"health":"true"}`. Plain HTTP/1.0 over a socket: no client library
/// needed for one request.
pub fn is_healthy(addr: SocketAddr) -> bool {
    let probe = || -> std::io::Result<String> {
        let timeout = Duration::from_millis(500);
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.write_all(b"GET /health HTTP/1.0\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    probe().is_ok_and(|r| r.contains("\"health\":\"true\""))
}
