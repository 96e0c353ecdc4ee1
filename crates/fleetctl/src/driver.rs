//! How fleetctl reaches the cluster, as fleet's `--driver` and `--endpoint` decide it:
//! - `api` (the default): fleetd's HTTP API, at `unix:///var/run/fleet.sock` unless
//!   `--endpoint` says otherwise (`unix://`/`file://` paths, `http://`, `https://`);
//!   [`http::HttpCluster`] speaks it.
//! - `etcd`: the registry in etcd directly, at `--endpoint`'s URLs (default
//!   `http://127.0.0.1:2379`).
//!
//! With no `--driver` (flag or `FLEETCTL_DRIVER`), an endpoint whose first URL has port 2379
//! or 4001 (etcd's ports) picks etcd, as fleet's does. The choice is pure ([`select`]); no
//! connection is made here.

mod answer;
mod changes;
mod creates;
mod events;
pub mod http;
mod import;
pub(crate) mod transport;
pub mod unit_api;
mod unreached;
mod watch;

pub use http::HttpCluster;
pub use transport::EndpointError;

/// The API driver's endpoint when none is given: fleetd's default socket.
pub const DEFAULT_API_ENDPOINT: &str = "unix:///var/run/fleet.sock";

/// The etcd driver's endpoint when none is given (fleetctl's before the API driver).
pub const DEFAULT_ETCD_ENDPOINT: &str = "http://127.0.0.1:2379";

/// Ports on which an endpoint is taken for etcd's when no driver is named.
const ETCD_PORTS: [u16; 2] = [2379, 4001];

/// The two ways to reach a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Api,
    Etcd,
}

impl std::str::FromStr for Driver {
    type Err = String;

    /// fleet spells the API driver `API`; `api` is taken too.
    fn from_str(s: &str) -> Result<Driver, String> {
        match s {
            "api" | "API" => Ok(Driver::Api),
            "etcd" => Ok(Driver::Etcd),
            other => Err(format!(
                "unrecognized driver {:?} (expected \"api\" or \"etcd\")",
                fleet_registry::input::shorten(other)
            )),
        }
    }
}

/// What [`select`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub driver: Driver,
    /// The endpoint(s) as given, or the driver's default.
    pub endpoint: String,
}

/// The driver and endpoint for the flags given (`None`: not given, by flag or environment).
pub fn select(driver: Option<Driver>, endpoint: Option<&str>) -> Selection {
    let endpoint = endpoint.map(str::trim).filter(|e| !e.is_empty());
    let driver = driver.unwrap_or(match endpoint {
        Some(e) if looks_like_etcd(e) => Driver::Etcd,
        _ => Driver::Api,
    });
    let endpoint = match (endpoint, driver) {
        (Some(e), _) => e.to_owned(),
        (None, Driver::Api) => DEFAULT_API_ENDPOINT.to_owned(),
        (None, Driver::Etcd) => DEFAULT_ETCD_ENDPOINT.to_owned(),
    };
    Selection { driver, endpoint }
}

/// The first of the comma-separated URLs is `scheme://host:2379` or `:4001`.
fn looks_like_etcd(endpoint: &str) -> bool {
    let first = endpoint.split(',').next().unwrap_or("").trim();
    let Some((_, rest)) = first.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let port = authority
        .rsplit_once(':')
        .filter(|(host, _)| !host.is_empty() && !host.ends_with('['))
        .and_then(|(_, port)| port.parse::<u16>().ok());
    port.is_some_and(|p| ETCD_PORTS.contains(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(driver: Option<&str>, endpoint: Option<&str>) -> (Driver, String) {
        let s = select(driver.map(|d| d.parse().unwrap()), endpoint);
        (s.driver, s.endpoint)
    }

    #[test]
    fn defaults_to_the_api_on_fleetds_socket() {
        assert_eq!(
            chosen(None, None),
            (Driver::Api, "unix:///var/run/fleet.sock".into())
        );
        assert_eq!(chosen(None, Some("  ")).0, Driver::Api);
    }

    #[test]
    fn an_endpoint_on_etcds_ports_picks_etcd_when_no_driver_is_named() {
        for e in [
            "http://127.0.0.1:2379",
            "https://10.0.0.1:4001/",
            "http://[::1]:2379",
            "http://a:2379,http://b:1234",
        ] {
            assert_eq!(chosen(None, Some(e)), (Driver::Etcd, e.to_owned()), "{e}");
        }
        for e in [
            "http://127.0.0.1:23790",
            "http://127.0.0.1:8080",
            "http://a:1234,http://b:2379",
            "unix:///var/run/fleet.sock",
            "https://fleet.example.com",
        ] {
            assert_eq!(chosen(None, Some(e)).0, Driver::Api, "{e}");
        }
    }

    #[test]
    fn a_named_driver_wins_over_the_endpoints_port() {
        assert_eq!(chosen(Some("api"), Some("http://h:2379")).0, Driver::Api);
        assert_eq!(chosen(Some("API"), None).0, Driver::Api);
        assert_eq!(
            chosen(Some("etcd"), Some("http://h:8080")),
            (Driver::Etcd, "http://h:8080".into())
        );
    }

    #[test]
    fn the_etcd_driver_without_an_endpoint_uses_etcds_local_address() {
        assert_eq!(
            chosen(Some("etcd"), None),
            (Driver::Etcd, "http://127.0.0.1:2379".into())
        );
    }

    #[test]
    fn refuses_an_unknown_driver_by_name() {
        let e = "grpc".parse::<Driver>().unwrap_err();
        assert_eq!(
            e,
            "unrecognized driver \"grpc\" (expected \"api\" or \"etcd\")"
        );
        assert!("Etcd".parse::<Driver>().is_err());
    }
}
