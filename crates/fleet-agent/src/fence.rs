//! The agent's side of the fence (`fleet_core::fence`, docs/guarantees.md promise 2): which
//! units it stops, and the loop that keeps it armed at the deadline the presence keeper
//! publishes. The timer itself is behind [`FenceTimer`] (the real one is
//! `systemd::fence::SystemdFence`). It never decides when to fence: the deadline does.
//!
//! Global units are never fenced: they run on every machine, so they cannot run twice on one.

use crate::manager::ManagerError;
use fleet_core::{Requirements, UnitFile, UnitName};
use std::path::Path;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// The fence's deadline as the presence keeper publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// When the fence fires unless pushed again.
    pub at: Instant,
    /// How many times, so far, a push found the deadline before it already passed: the
    /// lease may have lapsed then (a frozen fleetd), and the schedule held may be stale
    /// (`agent/doubt.rs`).
    pub lapses: u64,
    /// The lapses counted when a renewal (or registration) last pushed the deadline: below
    /// `lapses` while every push since a lapse was an unanswered request's, which moves the
    /// fence on (an outage must stop nothing) but says nothing of whether the lease lives.
    /// A thawed fleetd's first keep-alive times out at once, and it was such a push that
    /// let its agent act on a schedule read on an expired lease.
    pub live_lapses: u64,
}

impl Deadline {
    /// The deadline that follows `previous` when a renewal or registration sent at
    /// `at - TTL` succeeded at `now`: the lease lives, whatever lapsed before.
    pub fn renewed(previous: Option<Deadline>, at: Instant, now: Instant) -> Deadline {
        let lapses = Deadline::lapses_after(previous, now);
        Deadline {
            at,
            lapses,
            live_lapses: lapses,
        }
    }

    /// The deadline that follows `previous` when it is moved to `at` at `now` without a
    /// renewal (etcd did not answer): a lapse is counted, and not taken as ended.
    pub fn moved(previous: Option<Deadline>, at: Instant, now: Instant) -> Deadline {
        Deadline {
            at,
            lapses: Deadline::lapses_after(previous, now),
            live_lapses: previous.map_or(0, |p| p.live_lapses),
        }
    }

    /// Whether the last lapse was followed by a renewal.
    pub fn live(&self) -> bool {
        self.live_lapses == self.lapses
    }

    fn lapses_after(previous: Option<Deadline>, now: Instant) -> u64 {
        previous.map_or(0, |p| p.lapses + u64::from(now > p.at))
    }
}

/// A deadline in systemd that stops this machine's non-global units when it passes.
pub trait FenceTimer: Send + Sync {
    /// Arms the fence to fire `after` from now, replacing the one armed before.
    fn arm(&self, after: Duration) -> impl Future<Output = Result<(), ManagerError>> + Send;
}

/// The units the fence stops, of the files of fleet's units directory: every unit whose file
/// is not `Global=true`. A file that cannot be read as a unit file is fenced too: a global
/// unit stopped by mistake is started again by its fleetd, a copy left running may be a
/// second one.
pub fn fenced<'a>(
    files: impl IntoIterator<Item = (&'a UnitName, Option<&'a UnitFile>)>,
) -> Vec<UnitName> {
    files
        .into_iter()
        .filter(|(name, file)| !file.is_some_and(|f| Requirements::global(name, f)))
        .map(|(name, _)| name.clone())
        .collect()
}

/// [`fenced`] of the files in `dir`. Names that are not unit names (an interrupted write's
/// temporary file) are not fleet's units and are skipped.
pub fn fenced_in(dir: &Path) -> std::io::Result<Vec<UnitName>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Some(name) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<UnitName>().ok())
        else {
            continue;
        };
        let file = std::fs::read(entry.path())
            .ok()
            .and_then(|bytes| UnitFile::parse(&bytes).ok());
        files.push((name, file));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(fenced(files.iter().map(|(n, f)| (n, f.as_ref()))))
}

/// The file beside the units directory where fleetd writes its fence's deadline before it
/// arms it: the fence reads it when it fires and stands down if fleetd pushed it further, so
/// that a call to arm the new timer that PID 1 answers late (a machine starting thousands of
/// units) does not fence the units of a fleetd that is alive.
pub fn deadline_file(units_dir: &Path) -> std::path::PathBuf {
    units_dir
        .parent()
        .unwrap_or(units_dir)
        .join("fence-deadline")
}

/// Seconds since boot (`/proc/uptime`, which every process reads alike and which no wall-clock
/// step moves), with its 10 ms resolution.
pub fn uptime() -> std::io::Result<Duration> {
    let text = std::fs::read_to_string("/proc/uptime")?;
    parse_seconds(text.split_whitespace().next().unwrap_or_default())
        .ok_or_else(|| std::io::Error::other(format!("/proc/uptime reads {text:?}")))
}

fn parse_seconds(text: &str) -> Option<Duration> {
    let secs: f64 = text.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

/// Writes `deadline` (on the [`uptime`] clock) into `path`, replacing it at once.
pub fn write_deadline(path: &Path, deadline: Duration) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{:.3}\n", deadline.as_secs_f64()))?;
    std::fs::rename(&tmp, path)
}

/// The deadline last written into `path`, if it reads as one.
pub fn read_deadline(path: &Path) -> Option<Duration> {
    parse_seconds(&std::fs::read_to_string(path).ok()?)
}

/// The wall-clock time of `deadline` (an instant of this process's monotonic clock).
pub fn wall_clock(deadline: Instant, now: Instant) -> SystemTime {
    SystemTime::now() + deadline.saturating_duration_since(now)
}

/// Keeps `fence` armed at the latest deadline of `deadlines` until `shutdown`. A failure to
/// arm leaves the fence armed before in place (it fires earlier, never later) and is retried
/// at the next deadline.
pub async fn keep_armed<F: FenceTimer>(
    fence: F,
    mut deadlines: watch::Receiver<Option<Deadline>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut failing = false;
    loop {
        let deadline = deadlines.borrow_and_update().map(|d| d.at);
        if let Some(deadline) = deadline {
            let after = deadline.saturating_duration_since(Instant::now());
            match fence.arm(after).await {
                Ok(()) if failing => {
                    failing = false;
                    info!(?after, "fence armed again");
                }
                Ok(()) => {}
                Err(e) => {
                    failing = true;
                    warn!(error = %chain(&e), ?after, "arming the fence failed; the one armed before stays");
                }
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            changed = deadlines.changed() => if changed.is_err() { return },
        }
    }
}

/// An error and its causes, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn unit(name: &str, text: &str) -> (UnitName, Option<UnitFile>) {
        (name.parse().unwrap(), UnitFile::parse(text.as_bytes()).ok())
    }

    #[test]
    fn fences_every_unit_but_the_global_ones() {
        let files = [
            unit("a.service", "[Service]\nExecStart=/bin/true\n"),
            unit(
                "g.service",
                "[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\n",
            ),
            unit("web@1.service", "[X-Fleet]\nGlobal=false\n"),
        ];
        let out = fenced(files.iter().map(|(n, f)| (n, f.as_ref())));
        assert_eq!(
            out,
            [
                "a.service".parse::<UnitName>().unwrap(),
                "web@1.service".parse().unwrap()
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_push_after_the_deadline_passed_counts_a_lapse() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let first = Deadline::renewed(None, t0 + s(3), t0);
        assert_eq!(first.lapses, 0);
        let on_time = Deadline::renewed(Some(first), t0 + s(4), t0 + s(1));
        assert_eq!(on_time.lapses, 0);
        let late = Deadline::renewed(Some(on_time), t0 + s(13), t0 + s(10));
        assert_eq!(late.lapses, 1);
        assert!(late.live());
    }

    /// A fleetd thawed past its deadline: its first keep-alive times out at once, and the
    /// outage's move of the fence counts the lapse but does not end it; the renewal does.
    #[tokio::test(start_paused = true)]
    async fn a_move_without_a_renewal_leaves_a_lapse_unended() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let first = Deadline::renewed(None, t0 + s(3), t0);
        let on_time = Deadline::moved(Some(first), t0 + s(4), t0 + s(1));
        assert_eq!((on_time.lapses, on_time.live()), (0, true));
        let thawed = Deadline::moved(Some(on_time), t0 + s(13), t0 + s(10));
        assert_eq!((thawed.lapses, thawed.live()), (1, false));
        let again = Deadline::moved(Some(thawed), t0 + s(14), t0 + s(11));
        assert_eq!((again.lapses, again.live()), (1, false));
        let renewed = Deadline::renewed(Some(again), t0 + s(15), t0 + s(12));
        assert_eq!((renewed.lapses, renewed.live()), (1, true));
    }

    #[test]
    fn fences_a_unit_whose_file_cannot_be_read() {
        let name: UnitName = "x.service".parse().unwrap();
        assert_eq!(fenced([(&name, None)]), std::slice::from_ref(&name));
    }

    #[test]
    fn a_written_deadline_reads_back_and_junk_reads_as_none() {
        let dir = std::env::temp_dir().join(format!("fleet-fence-deadline-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("units")).unwrap();
        let path = deadline_file(&dir.join("units"));
        assert_eq!(path, dir.join("fence-deadline"));
        write_deadline(&path, Duration::from_millis(12_345_678)).unwrap();
        assert_eq!(
            read_deadline(&path),
            Some(Duration::from_millis(12_345_678))
        );
        std::fs::write(&path, "soon").unwrap();
        assert_eq!(read_deadline(&path), None);
        std::fs::write(&path, "-3").unwrap();
        assert_eq!(read_deadline(&path), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(uptime().unwrap() > Duration::ZERO);
    }

    #[test]
    fn reads_the_units_directory_and_skips_what_is_not_a_unit() {
        let dir = std::env::temp_dir().join(format!("fleet-fence-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.service"), "[Service]\nExecStart=/bin/true\n").unwrap();
        std::fs::write(dir.join("g.service"), "[X-Fleet]\nGlobal=true\n").unwrap();
        std::fs::write(dir.join(".fleet-tmp-1"), "junk").unwrap();
        let out = fenced_in(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out, ["a.service".parse::<UnitName>().unwrap()]);
    }

    /// Records every arming, with the paused clock's time.
    #[derive(Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<Duration>>>);

    impl FenceTimer for Recorder {
        async fn arm(&self, after: Duration) -> Result<(), ManagerError> {
            self.0.lock().unwrap().push(after);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn arms_at_each_new_deadline_until_shutdown() {
        let start = Instant::now();
        let at = |s| {
            Some(Deadline {
                at: start + Duration::from_secs(s),
                lapses: 0,
                live_lapses: 0,
            })
        };
        let (tx, rx) = watch::channel(at(5));
        let (stop_tx, stop_rx) = watch::channel(false);
        let rec = Recorder::default();
        let task = tokio::spawn(keep_armed(rec.clone(), rx, stop_rx));
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send_replace(at(7));
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop_tx.send_replace(true);
        task.await.unwrap();
        tx.send_replace(at(9));
        assert_eq!(
            *rec.0.lock().unwrap(),
            [Duration::from_secs(5), Duration::from_secs(6)]
        );
    }
}
