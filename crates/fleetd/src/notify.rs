//! Telling systemd how fleetd is doing (`sd_notify`): `READY=1` once this machine is
//! registered and its agent has reconciled once, a `STATUS=` line for `systemctl status
//! fleet`, `WATCHDOG=1` every half `WatchdogSec=` while the runtime runs, `STOPPING=1` on
//! the way out.
//!
//! A few lines over the datagram socket `NOTIFY_SOCKET` names (a path, or `@` for an abstract
//! name), as `sd_notify(3)` describes. Without `NOTIFY_SOCKET` (not under systemd, or
//! `NotifyAccess=none`) every call does nothing. A failed send is not an error of fleetd's:
//! systemd may not be listening; it is logged at debug and forgotten.

use fleet_agent::Progress;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{Instrument, debug};

/// The sender of notifications; `Notifier::default()` sends nothing.
#[derive(Debug, Default)]
pub struct Notifier {
    socket: Option<UnixDatagram>,
}

impl Notifier {
    /// From the environment systemd gives a service.
    pub fn from_env() -> Notifier {
        match std::env::var("NOTIFY_SOCKET") {
            Ok(addr) => Self::connect(&addr).unwrap_or_else(|e| {
                debug!(error = %e, socket = addr, "cannot reach systemd's notify socket");
                Notifier::default()
            }),
            Err(_) => Notifier::default(),
        }
    }

    /// To the socket `addr` (`NOTIFY_SOCKET`'s syntax).
    pub fn connect(addr: &str) -> io::Result<Notifier> {
        let socket = UnixDatagram::unbound()?;
        match addr.strip_prefix('@') {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.connect_addr(&addr)?;
            }
            None => socket.connect(addr)?,
        }
        // Never block a runtime thread on systemd.
        socket.set_nonblocking(true)?;
        Ok(Notifier {
            socket: Some(socket),
        })
    }

    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={}", one_line(status)));
    }

    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    pub fn stopping(&self, status: &str) {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    fn send(&self, state: &str) {
        let Some(socket) = &self.socket else { return };
        if let Err(e) = socket.send(state.as_bytes()) {
            debug!(error = %e, "notifying systemd failed");
        }
    }
}

/// A status is one line: a newline would start another assignment.
fn one_line(status: &str) -> String {
    status.replace('\n', " ")
}

/// How often to ping the watchdog: half of `WATCHDOG_USEC`, when `WATCHDOG_PID` is unset or
/// names this process (systemd sets both for the main process only).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if pid.is_some_and(|p| p.parse() != Ok(me)) {
        return None;
    }
    let usec: u64 = usec?.parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec) / 2)
}

/// [`watchdog_interval`] of this process's environment.
pub fn watchdog_from_env() -> Option<Duration> {
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// Pings the watchdog if systemd asked for it, from startup on: also while fleetd waits for
/// etcd to register (systemd may count from the start of the process). Ends with the runtime.
pub fn spawn_watchdog(notifier: Arc<Notifier>) {
    let Some(every) = watchdog_from_env() else {
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notifier.watchdog();
        }
    });
}

/// Says READY=1 once the agent has reconciled once, then keeps the status line current.
/// Ends with the runtime.
pub fn spawn_status(notifier: Arc<Notifier>, mut progress: watch::Receiver<Progress>) {
    tokio::spawn(
        async move {
            let Ok(first) = progress.wait_for(|p| p.reconciled).await.map(|p| *p) else {
                return;
            };
            notifier.ready(&running_status(first.units, first.failing));
            while progress.changed().await.is_ok() {
                let p = *progress.borrow_and_update();
                notifier.status(&running_status(p.units, p.failing));
            }
        }
        .in_current_span(),
    );
}

/// The `STATUS=` line of a running fleetd.
pub fn running_status(units: usize, failing: usize) -> String {
    let units = match units {
        1 => "1 unit".to_owned(),
        n => format!("{n} units"),
    };
    match failing {
        0 => format!("running: {units} here"),
        n => format!("running: {units} here, {n} failing (retrying)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(name: &str) -> (UnixDatagram, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("fleetd-notify-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        (UnixDatagram::bind(&path).unwrap(), path)
    }

    fn recv(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 4096];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_ready_status_watchdog_and_stopping_as_systemd_reads_them() {
        let (systemd, path) = listener("path");
        let notifier = Notifier::connect(path.to_str().unwrap()).unwrap();
        notifier.ready("running: 2 units here");
        assert_eq!(recv(&systemd), "READY=1\nSTATUS=running: 2 units here");
        notifier.status("waiting\nfor etcd");
        assert_eq!(recv(&systemd), "STATUS=waiting for etcd");
        notifier.watchdog();
        assert_eq!(recv(&systemd), "WATCHDOG=1");
        notifier.stopping("stopping");
        assert_eq!(recv(&systemd), "STOPPING=1\nSTATUS=stopping");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("fleetd-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
        let systemd = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::connect(&format!("@{name}")).unwrap().watchdog();
        assert_eq!(recv(&systemd), "WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let notifier = Notifier::default();
        notifier.ready("x");
        notifier.watchdog();
        assert!(Notifier::connect("/nonexistent/notify").is_err());
    }

    #[test]
    fn pings_the_watchdog_at_half_its_timeout_and_only_for_its_own_pid() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_interval(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn the_status_line_counts_units_and_failures() {
        assert_eq!(running_status(1, 0), "running: 1 unit here");
        assert_eq!(
            running_status(3, 2),
            "running: 3 units here, 2 failing (retrying)"
        );
    }
}
