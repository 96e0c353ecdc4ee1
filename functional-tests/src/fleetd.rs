//! How fleetd runs inside a machine: a unit file and an environment file that the harness
//! writes and the machine's boot copies into its private /run.
//!
//! fleetd is an ordinary service of the machine's systemd, so tests exercise it the way it runs
//! in production: started at boot, restarted on failure, stopped with `systemctl stop`.
//! `KillMode=process`: stopping or restarting fleetd kills fleetd only, never the units it
//! started (those live in their own cgroups anyway), because fleet must survive its own restart
//! without disturbing the workload.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

/// Where the host's binary directory is mounted (read-only) inside every machine.
pub const MACHINE_BIN_DIR: &str = "/opt/fleet/bin";
/// fleetd's environment file inside a machine.
pub const ENV_FILE: &str = "/run/fleet/fleetd.env";
/// fleetd's unit name inside a machine: `fleet.service`, as `dist/` ships it (and fleet did).
pub const UNIT: &str = "fleet.service";

/// How to run fleetd in each machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetdSpec {
    /// Host directory holding `fleetd` (and `fleetctl`): `$FLEET_BIN_DIR`, else
    /// `<workspace>/target/debug`.
    pub bin_dir: PathBuf,
    /// `FLEET_AGENT_TTL`, a Go-style duration as fleet's config takes it.
    pub agent_ttl: String,
    /// `FLEET_METADATA`; `{name}` is replaced by the machine's name. Default `hostname={name}`.
    pub metadata: String,
    /// More environment for fleetd (e.g. `FLEET_ETCD_KEY_PREFIX`, `RUST_LOG`); these win over
    /// the harness's own keys.
    pub env: BTreeMap<String, String>,
    /// Serve the API also on TCP with TLS, at this port of the machine's IP, which fleetd
    /// then publishes as its `https://` address: the harness makes the certificates
    /// ([`crate::ApiCerts`]: the cluster's authority and fleetctl's client certificate in
    /// `<run dir>/tls`, each machine's server certificate in its `/run/fleet/tls`).
    #[serde(default)]
    pub api_tls_port: Option<u16>,
    /// etcd with authentication on (`crate::auth`): each fleetd runs as its own host user.
    #[serde(default)]
    pub etcd_auth: Option<EtcdAuthSpec>,
}

/// Who gets which etcd roles in a cluster with etcd's auth on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdAuthSpec {
    /// Machine indexes (1 for `m1`) whose host user holds its machine role only: no engine
    /// role (although their fleetd runs an engine: it must never lead), no role for its API.
    /// The others' users are engine-capable and their API may write.
    pub machine_only: Vec<u32>,
}

impl Default for FleetdSpec {
    fn default() -> Self {
        FleetdSpec {
            bin_dir: crate::state::default_bin_dir(),
            agent_ttl: "3s".to_owned(),
            metadata: "hostname={name}".to_owned(),
            env: BTreeMap::new(),
            api_tls_port: None,
            etcd_auth: None,
        }
    }
}

impl FleetdSpec {
    /// Adds one environment variable for fleetd.
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// The same serving the API on TCP with TLS at `port` ([`FleetdSpec::api_tls_port`]).
    pub fn with_api_tls(mut self, port: u16) -> Self {
        self.api_tls_port = Some(port);
        self
    }

    /// The same with etcd's auth on ([`FleetdSpec::etcd_auth`]).
    pub fn with_etcd_auth(mut self, auth: EtcdAuthSpec) -> Self {
        self.etcd_auth = Some(auth);
        self
    }

    /// The environment file for one machine.
    pub fn env_file(&self, etcd_endpoint: &str, machine_name: &str, ip: Ipv4Addr) -> String {
        let mut env = BTreeMap::new();
        env.insert("FLEET_ETCD_SERVERS".to_owned(), etcd_endpoint.to_owned());
        env.insert("FLEET_PUBLIC_IP".to_owned(), ip.to_string());
        env.insert(
            "FLEET_METADATA".to_owned(),
            self.metadata.replace("{name}", machine_name),
        );
        env.insert("FLEET_AGENT_TTL".to_owned(), self.agent_ttl.clone());
        if let Some(port) = self.api_tls_port {
            let dir = crate::certs::MACHINE_DIR;
            env.insert("FLEET_API_LISTEN".to_owned(), format!("tcp:{ip}:{port}"));
            env.insert("FLEET_API_CAFILE".to_owned(), format!("{dir}/ca.pem"));
            env.insert("FLEET_API_CERTFILE".to_owned(), format!("{dir}/server.pem"));
            env.insert("FLEET_API_KEYFILE".to_owned(), format!("{dir}/server.key"));
            // fleetctl's certificate may do everything (the role tests add their own).
            let admin = format!("CN={}", crate::certs::CLIENT_CN);
            env.insert("FLEET_API_ADMINS".to_owned(), admin);
        }
        env.extend(self.env.clone());
        render_env(&env)
    }
}

/// systemd `EnvironmentFile=` syntax. Values are double-quoted so spaces and `#` survive.
pub fn render_env(env: &BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(k, v)| {
            let v = v.replace('\\', "\\\\").replace('"', "\\\"");
            format!("{k}=\"{v}\"\n")
        })
        .collect()
}

/// The hardening lines of `dist/fleet.service` (issue 37): every functional test runs fleetd
/// under them, so none of them may break what the tests prove.
fn hardening() -> String {
    const DIST: &str = include_str!("../../dist/fleet.service");
    DIST.lines()
        .skip_while(|l| !l.starts_with("# --- hardening"))
        .take_while(|l| !l.starts_with("# --- end hardening"))
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The fleetd unit. `RestartSec`/`StartLimitIntervalSec=0`: a fleetd that exits while etcd is
/// down keeps being restarted instead of giving up (and leaving the machine `degraded`).
/// `Type=simple` with `NotifyAccess=main`, unlike `dist/fleet.service`'s `Type=notify`: fleetd's
/// `STATUS=` lines show in `systemctl show -p StatusText`, while `systemctl start` does not
/// wait for READY (tests start fleetd with etcd away); `tests/operating.rs` checks READY
/// with a `Type=notify` drop-in.
pub fn unit_file() -> String {
    format!(
        "[Unit]
Description=fleet daemon (functional-test machine)
Wants=dbus.service
After=dbus.service
StartLimitIntervalSec=0

[Service]
EnvironmentFile={ENV_FILE}
ExecStart={MACHINE_BIN_DIR}/fleetd
NotifyAccess=main
Restart=on-failure
RestartSec=1s
KillMode=process
{hardening}",
        hardening = hardening()
    )
}

/// The target each machine boots: journald comes with sysinit.target, dbus, and fleetd if run.
pub fn machine_target(with_fleetd: bool) -> String {
    let fleetd = if with_fleetd { " fleet.service" } else { "" };
    format!(
        "[Unit]
Description=fleet functional-test machine
Requires=basic.target
After=basic.target
Wants=dbus.socket dbus.service{fleetd}
AllowIsolate=yes
"
    )
}

/// The target's name.
pub const MACHINE_TARGET: &str = "fleet-machine.target";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_fleetd_runs_under_the_hardening_of_the_shipped_unit() {
        let unit = unit_file();
        for line in [
            "ProtectSystem=full",
            "UMask=0077",
            "SystemCallFilter=@system-service",
        ] {
            assert!(
                unit.contains(&format!("\n{line}\n")),
                "{line} missing:\n{unit}"
            );
        }
        assert!(!unit.contains("# ---"), "{unit}");
    }

    #[test]
    fn env_file_has_the_harness_keys_and_extra_ones_win() {
        let spec = FleetdSpec::default()
            .with_env("FLEET_AGENT_TTL", "5s")
            .with_env("RUST_LOG", "debug warn");
        let env = spec.env_file(
            "http://10.251.3.1:2379",
            "m2",
            Ipv4Addr::new(10, 251, 3, 12),
        );
        assert_eq!(
            env,
            "FLEET_AGENT_TTL=\"5s\"\nFLEET_ETCD_SERVERS=\"http://10.251.3.1:2379\"\n\
             FLEET_METADATA=\"hostname=m2\"\nFLEET_PUBLIC_IP=\"10.251.3.12\"\n\
             RUST_LOG=\"debug warn\"\n"
        );
    }

    #[test]
    fn a_tls_api_listens_on_the_machines_ip_with_its_certificates() {
        let env = FleetdSpec::default().with_api_tls(49153).env_file(
            "http://10.251.3.1:2379",
            "m2",
            Ipv4Addr::new(10, 251, 3, 12),
        );
        for line in [
            "FLEET_API_LISTEN=\"tcp:10.251.3.12:49153\"",
            "FLEET_API_CAFILE=\"/run/fleet/tls/ca.pem\"",
            "FLEET_API_CERTFILE=\"/run/fleet/tls/server.pem\"",
            "FLEET_API_KEYFILE=\"/run/fleet/tls/server.key\"",
            "FLEET_API_ADMINS=\"CN=fleet functional client\"",
        ] {
            assert!(env.lines().any(|l| l == line), "{line} in {env}");
        }
    }
}
