//! fleetd's fence (`fleet_core::fence`, docs/guarantees.md promise 2): the task that keeps it
//! armed in systemd while fleetd lives, what fleetd says about it when it stops, and
//! `fleetd --fence UNITS_DIR`, which the fence's service runs when fleetd did not come back.

use anyhow::{Context, Result};
use fleet_agent::fence::{deadline_file, fenced_in, keep_armed, read_deadline, uptime, wall_clock};
use fleet_agent::systemd::fence::{SystemdFence, own_binary};
use fleet_agent::{SystemdConfig, SystemdManager};
use fleet_core::MachineInfo;
use fleet_core::fence::{STOP_GRACE, utc_seconds};
use fleet_registry::kv::Kv;
use fleet_registry::{MachineRole, Presence};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, error, info, warn};

use crate::logging;

/// Spawns the task that keeps the fence armed at the deadlines of `deadlines`.
pub fn spawn(
    tasks: &mut JoinSet<Result<()>>,
    systemd: SystemdManager,
    units_dir: &Path,
    deadlines: watch::Receiver<Option<fleet_agent::fence::Deadline>>,
    shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let exe = own_binary().context("finding fleetd's own binary for the fence")?;
    let fence = SystemdFence::new(systemd, &exe, units_dir);
    tasks.spawn(
        async move {
            keep_armed(fence, deadlines, shutdown).await;
            Ok(())
        }
        .in_current_span(),
    );
    Ok(())
}

/// Why `agent_ttl` leaves the fence no room, if it does: a push waits for a renewal, sent a
/// third of the TTL after the last one and answered (or given up) within
/// `etcd_request_timeout`; a push later than the TTL fires the fence of a live fleetd.
pub fn too_tight(agent_ttl: Duration, request_timeout: Duration) -> Option<String> {
    let worst = agent_ttl / 3 + request_timeout;
    (worst >= agent_ttl).then(|| {
        format!(
            "agent_ttl {agent_ttl:?} is too short for etcd_request_timeout {request_timeout:?}: \
             a renewal may end {worst:?} after the last one, when the fence has fired; use an \
             agent_ttl of at least 3 x (etcd_request_timeout + fleetd's restart delay)"
        )
    })
}

/// Says, at warning, when the fence will stop this machine's non-global units now that
/// fleetd stops, and writes it into the machine's presence record for `fleetctl
/// list-machines`. The record keeps its lease: the engine must not move anything before the
/// fence has fired.
pub async fn announce_stop<K: Kv>(
    role: &MachineRole<K>,
    presence: Option<Presence>,
    mut info: MachineInfo,
    deadline: Option<Instant>,
    units_dir: &Path,
) {
    let Some(deadline) = deadline else { return };
    let at = wall_clock(deadline, Instant::now());
    let units = fenced_in(units_dir).map_or(0, |u| u.len());
    warn!(
        units,
        deadline = %utc_seconds(at),
        "fleetd stopping: unless it returns by the deadline, this machine's non-global units are stopped then (its fence); restart quickly or drain first"
    );
    let Some(presence) = presence else { return };
    info.fence_at = at.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs());
    // etcd may be why fleetd stops: never hold the stop up for long.
    match tokio::time::timeout(
        Duration::from_secs(1),
        role.update_presence(&presence, &info),
    )
    .await
    {
        Ok(Ok(true)) => info!("fence deadline written into this machine's record"),
        Ok(Ok(false)) => info!("this machine's record is gone; fence deadline not written"),
        Ok(Err(e)) => {
            warn!(error = %e, "writing the fence deadline into this machine's record failed")
        }
        Err(_) => warn!("writing the fence deadline into this machine's record timed out"),
    }
}

/// How much later than now fleetd pushed its deadline, if it did since this fence was armed:
/// it runs (it holds its lock: a stopped fleetd, or a package removal that runs the fence at
/// once, must not find a deadline left from before), it wrote a later deadline, and a newer
/// fence timer is armed and waiting (a deadline written just before fleetd froze or died, with
/// no timer behind it, must not stand this one down). A push moves the deadline by a third of
/// the TTL at least; /proc/uptime's 10 ms steps may make this very fence's deadline read a
/// little later than now.
async fn pushed(systemd: &SystemdManager, units_dir: &Path) -> Option<Duration> {
    let runtime_dir = units_dir.parent().unwrap_or(units_dir);
    if !crate::lock::is_held(runtime_dir) {
        return None;
    }
    let (deadline, now) = (read_deadline(&deadline_file(units_dir))?, uptime().ok()?);
    if deadline <= now + STAND_DOWN_ABOVE {
        return None;
    }
    match systemd.fence_waiting().await {
        Ok(true) => Some(deadline - now),
        Ok(false) => None,
        Err(e) => {
            warn!(error = %e, "fence: cannot tell whether a newer fence is armed; fencing");
            None
        }
    }
}

/// How much later than now the deadline fleetd wrote must be for a firing fence to stand
/// down: well above /proc/uptime's 10 ms resolution, well below the TTL/3 of a push.
const STAND_DOWN_ABOVE: Duration = Duration::from_millis(100);

/// `fleetd --fence UNITS_DIR`: stops the non-global units of `units_dir`, each given
/// [`STOP_GRACE`] before it is killed.
pub fn run(units_dir: PathBuf) -> ExitCode {
    let (_, _) = logging::init(logging::LogFormat::Auto, "info");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(rt) => rt.block_on(fence(&units_dir)),
        Err(e) => Err(e).context("starting the runtime"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %crate::report::chain(&e), "fence failed");
            ExitCode::FAILURE
        }
    }
}

async fn fence(units_dir: &Path) -> Result<()> {
    let systemd = SystemdManager::connect(SystemdConfig {
        units_dir: units_dir.to_path_buf(),
        ..SystemdConfig::default()
    })
    .await
    .context("connecting to systemd")?;
    if let Some(pushed_by) = pushed(&systemd, units_dir).await {
        info!(
            pushed_by = ?pushed_by,
            "fence: fleetd pushed its deadline further while this fence was due, and its new fence is armed; nothing stopped"
        );
        return Ok(());
    }
    let units = fenced_in(units_dir).with_context(|| format!("listing {}", units_dir.display()))?;
    warn!(
        units = units.len(),
        dir = %units_dir.display(),
        "fence: fleetd did not push its deadline forward; stopping this machine's non-global units"
    );
    let started = Instant::now();
    let killed = systemd.fence_units(&units, STOP_GRACE).await?;
    for unit in &killed {
        warn!(%unit, grace = ?STOP_GRACE, "fence: killed a unit that had not stopped within the grace");
    }
    warn!(
        units = units.len(),
        killed = killed.len(),
        took = ?started.elapsed(),
        "fence: this machine's non-global units are stopped; fleetd starts what is still scheduled here when it returns"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_ttl_a_renewal_may_outlast_is_too_tight() {
        let s = Duration::from_secs;
        assert!(too_tight(s(3), s(1)).is_none());
        assert!(too_tight(s(30), s(1)).is_none());
        assert!(too_tight(s(3), s(2)).unwrap().contains("too short"));
        assert!(too_tight(Duration::from_millis(1500), s(1)).is_some());
    }
}
