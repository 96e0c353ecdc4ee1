//! The cluster's network, in the host's network namespace: one bridge per cluster with the
//! address 10.251.<subnet>.1/24 (etcd listens there), and per machine a network namespace with
//! a veth pair: `eth0` (10.251.<subnet>.<10+n>/24) inside, the other end on the bridge.
//!
//! Traffic never leaves the host: no default route inside the machines, no forwarding, no NAT.
//! A machine is cut off by setting its host-side veth down: packets are then silently dropped,
//! as in a real partition, rather than refused.

use crate::cmd;
use crate::state::bridge_ip;
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::net::Ipv4Addr;

/// Every bridge alias starts with this, followed by the path of the run's state file: how
/// `cleanup_stale` tells our bridges (and whose they are) from anything else.
pub const ALIAS_TAG: &str = "fleet-functional-tests state=";

#[derive(Debug, Deserialize)]
pub struct Link {
    #[serde(rename = "ifname")]
    pub name: String,
    #[serde(default)]
    addr_info: Vec<AddrInfo>,
}

#[derive(Debug, Deserialize)]
struct AddrInfo {
    #[serde(default)]
    family: String,
    /// IPv4 or IPv6, as text: only IPv4 ones are parsed.
    #[serde(default)]
    local: Option<String>,
    #[serde(default)]
    prefixlen: u8,
}

#[derive(Debug, Deserialize)]
struct Route {
    dst: String,
    #[serde(default)]
    dev: String,
}

/// The host's links with their IPv4 addresses.
pub fn links() -> Result<Vec<Link>> {
    let json = cmd::run("ip", ["-j", "address", "show"])?;
    serde_json::from_str(&json).context("cannot parse `ip -j address show`")
}

/// A host link's alias (`ip link set NAME alias ...`), if it has one.
pub fn alias(name: &str) -> Option<String> {
    let alias = std::fs::read_to_string(format!("/sys/class/net/{name}/ifalias")).ok()?;
    let alias = alias.trim_end_matches('\n');
    (!alias.is_empty()).then(|| alias.to_owned())
}

/// The host's named network namespaces.
pub fn netns_names() -> Result<Vec<String>> {
    Ok(cmd::run("ip", ["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

fn in_subnet(ip: Ipv4Addr, net: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix.min(32)))
        .unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Whether anything on the host already uses 10.251.<subnet>.0/24: an address in it, or a
/// route (other than the default) that covers it.
fn subnet_taken(subnet: u8, ignore_link: &str) -> Result<bool> {
    let ours = bridge_ip(subnet);
    for link in links()?.iter().filter(|l| l.name != ignore_link) {
        for addr in link.addr_info.iter().filter(|a| a.family == "inet") {
            let local = addr
                .local
                .as_deref()
                .and_then(|l| l.parse::<Ipv4Addr>().ok());
            let overlaps = local.is_some_and(|local| {
                in_subnet(local, ours, 24) || in_subnet(ours, local, addr.prefixlen)
            });
            if overlaps {
                return Ok(true);
            }
        }
    }
    let routes: Vec<Route> = serde_json::from_str(&cmd::run("ip", ["-j", "-4", "route", "show"])?)
        .context("cannot parse `ip -j route show`")?;
    for route in routes
        .iter()
        .filter(|r| r.dst != "default" && r.dev != ignore_link)
    {
        let (net, prefix) = route.dst.split_once('/').unwrap_or((&route.dst, "32"));
        if let (Ok(net), Ok(prefix)) = (net.parse::<Ipv4Addr>(), prefix.parse::<u8>())
            && (in_subnet(net, ours, 24) || in_subnet(ours, net, prefix))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Creates the cluster's bridge (tagged with `state_file` in its alias) and gives it the first
/// free 10.251.<subnet>.1/24, trying subnets from `first`. Returns the subnet byte.
///
/// Two runs may pick the same subnet at the same moment: each adds its address, then checks
/// that no other link has one in that subnet, and moves on if one does.
pub fn create_bridge(name: &str, state_file: &str, first: u8) -> Result<u8> {
    cmd::run(
        "ip",
        [
            "link",
            "add",
            name,
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
        ],
    )?;
    cmd::run(
        "ip",
        [
            "link",
            "set",
            name,
            "alias",
            &format!("{ALIAS_TAG}{state_file}"),
        ],
    )?;
    cmd::run("ip", ["link", "set", name, "up"])?;
    for step in 0..254u16 {
        let subnet = ((u16::from(first) + step) % 254 + 1) as u8;
        if subnet_taken(subnet, name)? {
            continue;
        }
        let cidr = format!("{}/24", bridge_ip(subnet));
        cmd::run("ip", ["address", "add", &cidr, "dev", name])?;
        if subnet_taken(subnet, name)? {
            cmd::run("ip", ["address", "del", &cidr, "dev", name])?;
            continue;
        }
        return Ok(subnet);
    }
    bail!("no free subnet in 10.251.0.0/16")
}

/// Creates network namespace `name` with `eth0` = `ip`/24 and `lo` up, its peer (also called
/// `name`, in the host namespace) enslaved to `bridge` and up.
pub fn create_machine_net(name: &str, bridge: &str, ip: Ipv4Addr) -> Result<()> {
    cmd::run("ip", ["netns", "add", name])?;
    // The peer is born inside the namespace, so its name cannot clash with the host's eth0.
    cmd::run(
        "ip",
        [
            "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name,
        ],
    )?;
    let inside = |args: &[&str]| cmd::run("ip", ["-n", name].iter().chain(args));
    inside(&["address", "add", &format!("{ip}/24"), "dev", "eth0"])?;
    inside(&["link", "set", "eth0", "up"])?;
    inside(&["link", "set", "lo", "up"])?;
    cmd::run("ip", ["link", "set", name, "master", bridge, "up"])?;
    Ok(())
}

/// Sets a host link up or down.
pub fn set_link(name: &str, up: bool) -> Result<()> {
    cmd::run("ip", ["link", "set", name, if up { "up" } else { "down" }]).map(drop)
}

/// Adds (`on`) or removes a blackhole route to `ip` in network namespace `netns`: packets to
/// it are dropped there, while the rest of the network works (issue 36: a machine cut off
/// from etcd alone, its peers still in reach). Removing one that is not there is fine.
pub fn blackhole(netns: &str, ip: Ipv4Addr, on: bool) -> Result<()> {
    let target = format!("{ip}/32");
    let verb = if on { "add" } else { "del" };
    let result = cmd::run("ip", ["-n", netns, "route", verb, "blackhole", &target]);
    if result.is_err() && !on {
        return Ok(());
    }
    result.map(drop)
}

/// Deletes network namespace `name`. Gone already is fine. The kernel frees the namespace (and
/// any veth end still in it) asynchronously, once its last process is gone.
pub fn delete_netns(name: &str) -> Result<()> {
    let result = cmd::run("ip", ["netns", "delete", name]);
    if result.is_err() && !netns_names()?.iter().any(|n| n == name) {
        return Ok(());
    }
    result.map(drop)
}

/// Deletes host link `name` (for a veth, both ends). Gone already is fine.
pub fn delete_link(name: &str) -> Result<()> {
    let result = cmd::run("ip", ["link", "delete", name]);
    if result.is_err() && !links()?.iter().any(|l| l.name == name) {
        return Ok(());
    }
    result.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_membership() {
        let net = Ipv4Addr::new(10, 251, 7, 0);
        assert!(in_subnet(Ipv4Addr::new(10, 251, 7, 200), net, 24));
        assert!(!in_subnet(Ipv4Addr::new(10, 251, 8, 1), net, 24));
        assert!(in_subnet(
            Ipv4Addr::new(10, 9, 9, 9),
            Ipv4Addr::new(10, 0, 0, 0),
            8
        ));
        assert!(in_subnet(Ipv4Addr::new(1, 2, 3, 4), net, 0));
    }
}
