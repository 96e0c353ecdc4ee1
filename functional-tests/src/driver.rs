//! Which way fleetctl reaches the cluster: straight to etcd, or through the fleet API of one
//! machine's fleetd, as fleet's `--driver etcd|api`.
//!
//! The machines are systemd in PID and mount namespaces, so fleetd's default socket,
//! `/var/run/fleet.sock` inside a machine, is `/proc/<pid1>/root/run/fleet.sock` from the host:
//! the machine's `/run` is its own tmpfs, and `/var/run` is an absolute symlink to `/run`,
//! which would resolve against the host's root through `/proc/<pid>/root`, so the harness names
//! `/run` itself. fleetctl then talks to that fleetd exactly as it would on the machine, over
//! the default unix socket, with no etcd address at all.
//!
//! A test run picks its driver with `FLEET_TEST_DRIVER` (`etcd`, the default, or `api`): the
//! same suites run once per driver (`make test` runs the fleetctl suites a second time with
//! `api`). A test that is about etcd itself (a stopped etcd, etcd's TLS) pins its driver.

use anyhow::{Result, bail};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The variable a test run's driver comes from.
pub const DRIVER_VAR: &str = "FLEET_TEST_DRIVER";

/// fleetd's default API socket inside a machine, as the host reaches it below
/// `/proc/<pid1>/root` (see the module doc for why not `/var/run`).
pub const MACHINE_API_SOCKET: &str = "run/fleet.sock";

/// fleetctl's two drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Driver {
    /// `--driver etcd --endpoint <etcd's URLs>`.
    Etcd,
    /// `--driver api --endpoint unix://<a machine's fleet.sock>`.
    Api,
}

impl Driver {
    /// Both, etcd first: for tests that compare what the two print.
    pub const ALL: [Driver; 2] = [Driver::Etcd, Driver::Api];

    /// `$FLEET_TEST_DRIVER`: unset or empty is etcd; anything but `etcd`/`api` is an error,
    /// so a typo cannot quietly run the suite over the wrong driver.
    pub fn from_env() -> Result<Driver> {
        Driver::parse(
            std::env::var_os(DRIVER_VAR)
                .as_deref()
                .and_then(|v| v.to_str()),
        )
    }

    fn parse(value: Option<&str>) -> Result<Driver> {
        match value.map(str::trim) {
            None | Some("") | Some("etcd") => Ok(Driver::Etcd),
            Some("api") => Ok(Driver::Api),
            Some(other) => bail!("{DRIVER_VAR}={other:?}: expected etcd or api"),
        }
    }

    /// fleet's name for it, as `--driver` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Driver::Etcd => "etcd",
            Driver::Api => "api",
        }
    }

    /// The environment that points fleetctl at the cluster this way: `FLEETCTL_DRIVER`, and
    /// `FLEETCTL_ENDPOINT` set to etcd's endpoint for [`Driver::Etcd`] or to the unix socket
    /// at `api_socket` (a host path) for [`Driver::Api`]. Variables, not flags, so that a test
    /// passing its own `--endpoint` still wins, as a user's flag wins over their environment.
    pub fn env(self, etcd_endpoint: &str, api_socket: &Path) -> [(&'static str, OsString); 2] {
        let endpoint = match self {
            Driver::Etcd => OsString::from(etcd_endpoint),
            Driver::Api => {
                let mut url = OsString::from("unix://");
                url.push(api_socket);
                url
            }
        };
        [
            ("FLEETCTL_DRIVER", OsString::from(self.name())),
            ("FLEETCTL_ENDPOINT", endpoint),
        ]
    }
}

impl std::fmt::Display for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// fleetd's API socket of the machine whose systemd is host PID `pid1`, as a host path.
pub fn machine_api_socket(pid1: u32) -> PathBuf {
    Path::new("/proc")
        .join(pid1.to_string())
        .join("root")
        .join(MACHINE_API_SOCKET)
}

/// Whether the fleetd behind the unix socket at `path` answers `GET /fleet/v1/machines` with
/// 200 within a second: not a stale socket file, a frozen fleetd, or one whose etcd is out of
/// reach (503).
pub fn serves(path: &Path) -> bool {
    use std::io::{Read, Write};
    let probe = || -> std::io::Result<bool> {
        let mut stream = std::os::unix::net::UnixStream::connect(path)?;
        stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
        stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
        stream.write_all(
            b"GET /fleet/v1/machines HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n",
        )?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head)?;
        Ok(head.ends_with(b" 200"))
    };
    probe().unwrap_or(false)
}

/// How long [`serves`] waits for fleetd's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The global arguments of a fleetctl run *inside* a machine over `driver`: etcd's endpoint,
/// or nothing but the driver for the API, whose default endpoint is the machine's own fleetd.
pub fn inside_machine_args(driver: Driver, etcd_endpoint: &str) -> Vec<String> {
    match driver {
        Driver::Etcd => ["--driver", "etcd", "--endpoint", etcd_endpoint]
            .map(str::to_owned)
            .to_vec(),
        Driver::Api => ["--driver", "api"].map(str::to_owned).to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_or_empty_variable_means_etcd_and_a_typo_is_an_error() {
        assert_eq!(Driver::parse(None).unwrap(), Driver::Etcd);
        assert_eq!(Driver::parse(Some("")).unwrap(), Driver::Etcd);
        assert_eq!(Driver::parse(Some("etcd")).unwrap(), Driver::Etcd);
        assert_eq!(Driver::parse(Some("api")).unwrap(), Driver::Api);
        let e = Driver::parse(Some("API ")).unwrap_err().to_string();
        assert!(e.contains("FLEET_TEST_DRIVER=\"API\""), "{e}");
    }

    #[test]
    fn inside_a_machine_the_api_driver_needs_no_endpoint() {
        assert_eq!(
            inside_machine_args(Driver::Api, "http://e:1"),
            ["--driver", "api"]
        );
        assert_eq!(
            inside_machine_args(Driver::Etcd, "http://e:1"),
            ["--driver", "etcd", "--endpoint", "http://e:1"]
        );
    }

    #[test]
    fn a_socket_nobody_serves_is_not_an_api() {
        assert!(!serves(Path::new("/nonexistent/fleet.sock")));
    }

    #[test]
    fn the_api_driver_names_the_machines_socket_as_a_unix_url() {
        let socket = machine_api_socket(4242);
        assert_eq!(socket, Path::new("/proc/4242/root/run/fleet.sock"));
        let env = Driver::Api.env("http://10.251.3.1:2379", &socket);
        assert_eq!(
            env,
            [
                ("FLEETCTL_DRIVER", "api".into()),
                (
                    "FLEETCTL_ENDPOINT",
                    "unix:///proc/4242/root/run/fleet.sock".into()
                )
            ]
        );
        let env = Driver::Etcd.env("http://10.251.3.1:2379", &socket);
        assert_eq!(
            env,
            [
                ("FLEETCTL_DRIVER", "etcd".into()),
                ("FLEETCTL_ENDPOINT", "http://10.251.3.1:2379".into())
            ]
        );
    }
}
