//! Why a connection to a fleetd could not be made, said in an operator's terms (issue 38):
//! `GET /fleet/v1/state at unix:///var/run/fleet.sock: No such file or directory` did not
//! say that no fleetd runs on this host, nor how to reach a cluster from a host without one.
//! Only the connect step is explained here; a fleetd that answers says why itself.

use std::io::ErrorKind;
use std::path::Path;

/// Where fleetctl tried to connect.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// A unix socket: on this host.
    Socket(&'a Path),
    /// `host:port`, plain or TLS.
    Address(&'a str),
}

/// Whether to say how to point fleetctl elsewhere: yes for the driver's own endpoint, no for
/// the fleetd of a unit's machine that `status`/`journal` ask (its address came from the
/// registry, not from the user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guide {
    Elsewhere,
    None,
    /// The endpoint is another service than a fleetd (fleet v1's etcd, for import-fleet):
    /// its refusal is said as it is.
    NotFleetd,
}

/// What to do from a host where no fleetd runs, or when the one named is down.
pub const ELSEWHERE: &str = "point fleetctl elsewhere with --endpoint (or FLEETCTL_ENDPOINT): \
    a fleetd's API address such as https://HOST:49153, or etcd's http://HOST:2379 with \
    --driver etcd";

/// The failed connect to `place`, explained where its cause has a plain meaning (then the
/// message says it all: the OS's words would only repeat it).
pub fn explain(place: Place<'_>, e: &std::io::Error, guide: Guide) -> String {
    let (why, nobody) = match (place, e.kind()) {
        (Place::Socket(p), ErrorKind::NotFound) => (
            format!(
                "no fleetd runs on this host: its socket {} does not exist",
                p.display()
            ),
            true,
        ),
        (Place::Socket(p), ErrorKind::ConnectionRefused) => (
            format!(
                "no fleetd runs on this host: its socket {} refuses connections",
                p.display()
            ),
            true,
        ),
        (Place::Socket(p), ErrorKind::PermissionDenied) => (
            format!(
                "fleetd's socket {} does not let this user in ({e}): run fleetctl as root or \
                 as a member of the socket's group (fleetd's api_socket_group)",
                p.display()
            ),
            false,
        ),
        (Place::Address(a), ErrorKind::ConnectionRefused) if guide == Guide::NotFleetd => (
            format!("nothing listens at {a} (connection refused)"),
            false,
        ),
        (Place::Address(a), ErrorKind::ConnectionRefused) => (
            format!("no fleetd listens at {a} (connection refused)"),
            true,
        ),
        (Place::Socket(_) | Place::Address(_), _) => (e.to_string(), false),
    };
    match (nobody, guide) {
        (true, Guide::Elsewhere) => format!("{why}; {ELSEWHERE}"),
        (true, Guide::None | Guide::NotFleetd) | (false, _) => why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: ErrorKind) -> std::io::Error {
        std::io::Error::from(kind)
    }

    #[test]
    fn a_missing_socket_says_no_fleetd_runs_here_and_where_to_look_instead() {
        let sock = Place::Socket(Path::new("/var/run/fleet.sock"));
        let e = explain(sock, &io(ErrorKind::NotFound), Guide::Elsewhere);
        assert!(
            e.starts_with(
                "no fleetd runs on this host: its socket /var/run/fleet.sock does not exist"
            ),
            "{e}"
        );
        assert!(e.ends_with(ELSEWHERE), "{e}");
        let e = explain(sock, &io(ErrorKind::ConnectionRefused), Guide::Elsewhere);
        assert!(e.contains("refuses connections"), "{e}");
        assert!(e.contains("--driver etcd"), "{e}");
    }

    #[test]
    fn a_refused_address_says_no_fleetd_listens_there() {
        let at = Place::Address("10.0.0.2:49153");
        let e = explain(at, &io(ErrorKind::ConnectionRefused), Guide::Elsewhere);
        assert!(
            e.starts_with("no fleetd listens at 10.0.0.2:49153 (connection refused); point"),
            "{e}"
        );
        assert!(e.contains("--endpoint"), "{e}");
    }

    #[test]
    fn a_units_machine_gets_the_reason_without_the_advice_for_the_driver() {
        let at = Place::Address("10.0.0.2:49153");
        let e = explain(at, &io(ErrorKind::ConnectionRefused), Guide::None);
        assert!(!e.contains("--endpoint"), "{e}");
    }

    #[test]
    fn a_socket_of_another_group_names_the_setting_and_no_other_host() {
        let sock = Place::Socket(Path::new("/var/run/fleet.sock"));
        let e = explain(sock, &io(ErrorKind::PermissionDenied), Guide::Elsewhere);
        assert!(e.contains("api_socket_group"), "{e}");
        assert!(!e.contains("--endpoint"), "{e}");
    }

    #[test]
    fn other_causes_pass_through_as_they_are() {
        let at = Place::Address("10.0.0.2:49153");
        let cause = io(ErrorKind::TimedOut);
        assert_eq!(explain(at, &cause, Guide::Elsewhere), cause.to_string());
    }
}
