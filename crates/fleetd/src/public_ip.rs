//! The automatic `public_ip`: the local address of a route to etcd, when none is configured.
//!
//! Every endpoint is tried in order until one has a route from a non-loopback address, so a
//! first endpoint that is unreachable from here (another network, a name that does not
//! resolve, a typo) does not leave the machine without an address. A UDP "connect" sends
//! nothing, so a dead member still gives the route to its host; the choice only depends on
//! routing. Loopback means "unknown": another machine could not use it.

use std::net::{IpAddr, UdpSocket};

/// The address other machines reach us at, or `""` if no endpoint gives one.
pub fn auto(endpoints: &[String]) -> String {
    choose(endpoints, route_from)
}

/// The first endpoint whose `route` gives a usable local address.
fn choose(endpoints: &[String], route: impl Fn(&str) -> Option<IpAddr>) -> String {
    endpoints
        .iter()
        .filter_map(|e| host_port(e))
        .filter_map(&route)
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .map(|ip| ip.to_string())
        .unwrap_or_default()
}

/// `host:port` of `scheme://host:port/...`.
fn host_port(endpoint: &str) -> Option<&str> {
    let rest = endpoint.split("://").nth(1)?;
    rest.split('/').next().filter(|hp| !hp.is_empty())
}

/// The local address the kernel would send from to `host_port`.
fn route_from(host_port: &str) -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect(host_port).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(list: &[&str]) -> Vec<String> {
        list.iter().map(|e| (*e).to_owned()).collect()
    }

    /// Routes of a host on 10.0.0.0/8 only: other networks are unreachable.
    fn routes(host_port: &str) -> Option<IpAddr> {
        match host_port.split(':').next()? {
            "127.0.0.1" => Some("127.0.0.1".parse().ok()?),
            h if h.starts_with("10.") => Some("10.0.0.7".parse().ok()?),
            _ => None,
        }
    }

    #[test]
    fn takes_the_route_of_a_later_endpoint_when_the_first_has_none() {
        let list = endpoints(&["http://192.0.2.1:2379", "http://10.1.2.3:2379"]);
        assert_eq!(choose(&list, routes), "10.0.0.7");
    }

    #[test]
    fn skips_loopback_and_malformed_endpoints() {
        let list = endpoints(&["garbage", "http://127.0.0.1:2379", "https://10.9.9.9:2379/"]);
        assert_eq!(choose(&list, routes), "10.0.0.7");
    }

    #[test]
    fn is_empty_when_no_endpoint_gives_an_address() {
        let list = endpoints(&["http://127.0.0.1:2379", "http://192.0.2.1:2379"]);
        assert_eq!(choose(&list, routes), "");
    }

    #[test]
    fn a_loopback_endpoint_gives_no_address_on_this_host() {
        assert_eq!(auto(&endpoints(&["http://127.0.0.1:2379"])), "");
    }
}
