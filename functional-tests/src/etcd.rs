//! The cluster's etcd: one or more real `/usr/bin/etcd` members on the host, each listening on
//! 127.0.0.1 and on the bridge address with its own client port, so the host (fleetctl, tests)
//! and every machine (fleetd) reach it. Members talk to each other on 127.0.0.1.
//!
//! Member 0 is named `flt<run id>` (what a single-member cluster always was), member `i > 0`
//! `flt<run id>e<i>`; the cleanup of an orphaned run finds them by those names. Their data
//! survives `stop`/`start`, which tests use to simulate an outage of one member or of all.
//!
//! What it shares with fleet-testing's launchers: free ports, the election timings, and the
//! HTTP side (health, status, leadership). What differs stays here: the members listen on
//! the bridge too and live detached (`setsid`) in a run directory; the binary is
//! `/usr/bin/etcd`, by which the cleanup of an orphaned run finds them; and readiness is a
//! blocking wait on `/health`, as the harness is blocking throughout.

use crate::proc::ProcId;
use crate::state::{ClusterState, EtcdMember, bridge_ip};
use anyhow::{Context, Result, bail};
pub use fleet_testing::MemberStatus;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a fresh or restarted etcd may take to answer `/health`.
/// Generous: a member of several waits for an election, and on a loaded 2-core CI machine
/// (other clusters booting, fsyncs queued) that can take many seconds.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(45);

/// Member `index`'s data directory: `etcd/`, `etcd-e<i>/`.
pub fn member_data_dir(state: &ClusterState, index: usize) -> PathBuf {
    match index {
        0 => state.dir.join("etcd"),
        i => state.dir.join(format!("etcd-e{i}")),
    }
}

/// Member `index`'s log: `etcd.log`, `etcd-e<i>.log`.
pub fn member_log_file(state: &ClusterState, index: usize) -> PathBuf {
    match index {
        0 => state.dir.join("etcd.log"),
        i => state.dir.join(format!("etcd-e{i}.log")),
    }
}

/// Member `index`'s etcd name.
pub fn member_name(state: &ClusterState, index: usize) -> String {
    match index {
        0 => state.bridge.clone(),
        i => format!("{}e{i}", state.bridge),
    }
}

/// Starts member `index` as recorded in `state` (ports, subnet), without waiting.
/// `setsid`: it must outlive a detached `fleet-cluster up` and not get the terminal's signals.
pub fn spawn(state: &ClusterState, index: usize) -> Result<(Child, ProcId)> {
    let subnet = state.subnet.context("etcd needs the cluster's subnet")?;
    let member = state.etcd.member(index).context("no such etcd member")?;
    let name = member_name(state, index);
    let client = |host: String| format!("http://{host}:{}", member.client_port);
    let peer = format!("http://127.0.0.1:{}", member.peer_port);
    let initial_cluster = (0..state.etcd.member_count())
        .filter_map(|i| {
            let m = state.etcd.member(i)?;
            Some(format!(
                "{}=http://127.0.0.1:{}",
                member_name(state, i),
                m.peer_port
            ))
        })
        .collect::<Vec<_>>()
        .join(",");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(member_log_file(state, index))
        .context("cannot open etcd's log")?;
    let mut command = Command::new("setsid");
    command.arg("/usr/bin/etcd");
    if state.etcd_v2 {
        command.arg("--enable-v2");
    }
    let child = command
        .args(["--name", &name])
        .arg("--data-dir")
        .arg(member_data_dir(state, index))
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
            &initial_cluster,
            "--initial-cluster-token",
            &state.bridge,
            "--logger=zap",
        ])
        .args(fleet_testing::ETCD_FAST_ELECTIONS)
        .current_dir(&state.dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("cannot start /usr/bin/etcd")?;
    let process = ProcId::of(child.id())?;
    Ok((child, process))
}

/// Waits until member `index` (spawned as `child`) is healthy; kills it if it does not get
/// there. A member of several is healthy once the cluster has a leader, so start every
/// member before waiting for any.
pub fn wait_healthy(state: &ClusterState, index: usize, child: &mut Child) -> Result<()> {
    let subnet = state.subnet.context("etcd needs the cluster's subnet")?;
    let member = state.etcd.member(index).context("no such etcd member")?;
    let process = ProcId::of(child.id())?;
    let addr = SocketAddr::from((bridge_ip(subnet), member.client_port));
    let healthy = crate::wait_for(HEALTH_TIMEOUT, Duration::from_millis(20), || {
        is_healthy(addr) || matches!(child.try_wait(), Ok(Some(_)))
    });
    let log = member_log_file(state, index);
    if let Ok(Some(status)) = child.try_wait() {
        bail!("etcd exited with {status} at start; see {}", log.display());
    }
    if let Err(e) = healthy {
        let _ = process.kill_and_wait(Duration::from_secs(5));
        let _ = child.wait();
        return Err(e).context(format!(
            "etcd not healthy; see {}; it ends with:\n{}",
            log.display(),
            log_tail(&log, 12)
        ));
    }
    Ok(())
}

/// The last `lines` lines of an etcd log (each cut to 300 characters), for an error message:
/// CI keeps the test's output, not the cluster's files.
fn log_tail(log: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.chars().take(300).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `GET /health` answers `{"health":"true"}`.
pub fn is_healthy(addr: SocketAddr) -> bool {
    let request = "GET /health HTTP/1.0\r\n\r\n";
    fleet_testing::http_exchange(addr, request, Duration::from_millis(500))
        .is_ok_and(|r| r.contains("\"health\":\"true\""))
}

/// What member `addr` says about itself: its ID and the leader it knows.
pub fn status(addr: SocketAddr) -> Result<MemberStatus> {
    fleet_testing::member_status(addr).with_context(|| format!("etcd status of {addr}"))
}

/// Asks the leader at `leader` to hand leadership to the member whose ID is `target`
/// (`etcdctl move-leader`).
pub fn transfer_leadership(leader: SocketAddr, target: u64) -> Result<()> {
    let body = format!("{{\"targetID\":\"{target}\"}}");
    let path = "/v3/maintenance/transfer-leadership";
    let answer = fleet_testing::post_json(leader, path, &body)
        .with_context(|| format!("POST {path} to etcd {leader}"))?;
    if answer.contains("\"error\"") || answer.contains("\"code\"") {
        bail!("etcd refused to move the leader: {answer}");
    }
    Ok(())
}

/// The client address of member `member` on the bridge.
pub fn member_addr(state: &ClusterState, member: &EtcdMember) -> Option<SocketAddr> {
    Some(SocketAddr::from((
        bridge_ip(state.subnet?),
        member.client_port,
    )))
}
