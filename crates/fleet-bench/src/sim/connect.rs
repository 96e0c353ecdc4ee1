//! The simulation's etcd connections, as its shape asks: the machines' (one each in the
//! production shape, logged in as the machine's own etcd user; 16 shared in the lab's),
//! fleetctl's (its own, as the operator, on fleetctl's deadline), and the benchmark's own
//! monitor's (as root, on a long deadline: it measures, it is not part of the cluster).

use anyhow::{Context, Result};
use fleet_registry::kv::{EtcdAuth, EtcdConfig, EtcdKv};
use fleet_testing::TestEtcd;
use std::time::Duration;

use super::auth::Credentials;
use crate::shape::ShapeSpec;

/// The monitor's deadline: long, since a failed read of the benchmark's own view would end
/// the run rather than measure it.
const MONITOR_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct Connections {
    /// Machine `i` uses `machines[i % len]`.
    pub machines: Vec<EtcdKv>,
    pub client: EtcdKv,
    /// As root when auth is on (the lab's machine loss revokes leases with it too).
    pub monitor: EtcdKv,
}

impl Connections {
    pub async fn open(
        etcd: &TestEtcd,
        shape: &ShapeSpec,
        credentials: Option<&Credentials>,
    ) -> Result<Connections> {
        let root = etcd.config().auth;
        // With TLS every connection, the machines' too, presents etcd's one client
        // certificate: docs/deploy.md gives each host its own, but the password decides who
        // a request is, and the handshake costs the same.
        let tls = etcd.config().tls;
        let config = |auth: Option<EtcdAuth>, request_timeout: Duration| EtcdConfig {
            endpoints: vec![etcd.endpoint()],
            request_timeout,
            tls: tls.clone(),
            auth,
        };
        let own = credentials.filter(|c| c.machines.len() == shape.connections);
        let mut machines = Vec::with_capacity(shape.connections);
        for i in 0..shape.connections.max(1) {
            // Connections shared by machines cannot be any one machine's user.
            let user = match own {
                Some(c) => Some(c.machines[i].clone()),
                None => root.clone(),
            };
            let kv = EtcdKv::connect(&config(user, shape.daemon_deadline))
                .await
                .context("connecting to etcd")?;
            machines.push(kv);
        }
        // fleetctl's own connection, with fleetctl's deadline: with auth off it shared
        // machine 0's, and so fleetd's 1 s (stop 57: the submit failed on it at 10,000
        // machines, where fleetctl would have waited 3 s).
        let operator = credentials.map_or_else(|| root.clone(), |c| Some(c.operator.clone()));
        let client = EtcdKv::connect(&config(operator, shape.client_deadline))
            .await
            .context("connecting fleetctl")?;
        let monitor = EtcdKv::connect(&config(root, MONITOR_DEADLINE))
            .await
            .context("connecting the monitor")?;
        Ok(Connections {
            machines,
            client,
            monitor,
        })
    }
}
