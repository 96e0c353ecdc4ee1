//! The cluster's registry from a (synchronous) test: what fleetctl and the engine would write,
//! written directly through `fleet_registry`, and what agents publish, read back.
//!
//! Tests write schedules themselves (the engine is not under test here), so this wraps the few
//! registry calls they need in blocking methods over a small private tokio runtime.

use crate::cluster::Cluster;
use anyhow::{Context, Result, bail};
use fleet_core::{DesiredState, MachineId, UnitFile, UnitHash, UnitName};
use fleet_registry::kv::{EtcdConfig, EtcdKv, Kv, Revision, Txn, TxnOp};
use fleet_registry::{
    CreateOutcome, DEFAULT_PREFIX, Key, Registry, ScheduleEntry, UnitStateRecord, UnitsRole,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// A registry client for tests, on the default key prefix.
#[derive(Debug)]
pub struct TestRegistry {
    runtime: tokio::runtime::Runtime,
    registry: Registry<EtcdKv>,
}

impl TestRegistry {
    /// A client of the cluster's etcd, under fleet's default key prefix.
    /// With etcd's auth on, as etcd's root (the test sees and may write everything).
    pub fn of(cluster: &Cluster) -> Result<TestRegistry> {
        let root = cluster.etcd_credentials(crate::auth::ROOT)?;
        TestRegistry::connect_as(&cluster.etcd_endpoint(), DEFAULT_PREFIX, root)
    }

    /// A client of `endpoint` (one URL, or several comma-separated).
    pub fn connect(endpoint: &str, prefix: &str) -> Result<TestRegistry> {
        TestRegistry::connect_as(endpoint, prefix, None)
    }

    /// The same as etcd user `auth` (none: anonymously).
    pub fn connect_as(
        endpoint: &str,
        prefix: &str,
        auth: Option<fleet_registry::kv::EtcdAuth>,
    ) -> Result<TestRegistry> {
        // One worker thread: etcd-client's connection tasks keep running between calls.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("cannot start a tokio runtime")?;
        let kv = runtime
            .block_on(EtcdKv::connect(&EtcdConfig {
                endpoints: endpoint.split(',').map(str::to_owned).collect(),
                request_timeout: Duration::from_secs(2),
                tls: Default::default(),
                auth,
            }))
            .with_context(|| format!("cannot connect to etcd at {endpoint}"))?;
        Ok(TestRegistry {
            runtime,
            registry: Registry::new(kv, prefix),
        })
    }

    /// The registry itself, for calls not wrapped here (run them with [`TestRegistry::block_on`]).
    pub fn registry(&self) -> &Registry<EtcdKv> {
        &self.registry
    }

    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Creates unit `name` from `text` (as `fleetctl submit` would); fails if it exists.
    pub fn create_unit(&self, name: &str, text: &str, desired: DesiredState) -> Result<UnitHash> {
        let name: UnitName = name
            .parse()
            .with_context(|| format!("unit name {name:?}"))?;
        let file =
            UnitFile::parse(text.as_bytes()).with_context(|| format!("unit file {text:?}"))?;
        match self
            .block_on(UnitsRole::new(self.registry.clone()).create_unit(&name, &file, desired))?
        {
            CreateOutcome::Created(unit) => Ok(unit.hash()),
            CreateOutcome::Exists(_) => bail!("unit {name} already exists"),
        }
    }

    /// Schedules `name` (which must exist) to `machine` in state `desired`, as the engine would.
    pub fn schedule(&self, machine: &MachineId, name: &str, desired: DesiredState) -> Result<()> {
        let name: UnitName = name.parse()?;
        let unit = self
            .block_on(self.registry.unit(&name))?
            .with_context(|| format!("no unit {name} in the registry"))?;
        let entry = ScheduleEntry {
            name,
            machine: machine.clone(),
            hash: unit.hash(),
            desired,
            restart: 0,
            no_restart: false,
            placement: 0,
        };
        self.block_on(self.registry.write_schedule(&[entry], &[]))?;
        Ok(())
    }

    /// Creates unit `name` from `text` and schedules it to `machine`, both `desired`.
    pub fn submit_and_schedule(
        &self,
        machine: &MachineId,
        name: &str,
        text: &str,
        desired: DesiredState,
    ) -> Result<UnitHash> {
        let hash = self.create_unit(name, text, desired)?;
        self.schedule(machine, name, desired)?;
        Ok(hash)
    }

    /// Deletes `name`'s schedule entry on `machine`.
    pub fn unschedule(&self, machine: &MachineId, name: &str) -> Result<()> {
        let name: UnitName = name.parse()?;
        self.block_on(
            self.registry
                .write_schedule(&[], &[(machine.clone(), name)]),
        )?;
        Ok(())
    }

    /// The IDs of every machine with a live presence.
    pub fn machine_ids(&self) -> Result<Vec<MachineId>> {
        let machines = self.block_on(self.registry.machines())?;
        Ok(machines.items.into_iter().map(|m| m.id).collect())
    }

    /// Every published unit state.
    pub fn unit_states(&self) -> Result<Vec<UnitStateRecord>> {
        Ok(self.block_on(self.registry.unit_states())?.items)
    }

    /// The state `machine` publishes for `name`, if any.
    pub fn unit_state(&self, name: &str, machine: &MachineId) -> Result<Option<UnitStateRecord>> {
        Ok(self
            .unit_states()?
            .into_iter()
            .find(|s| s.name.as_str() == name && &s.machine == machine))
    }

    /// The mod revision of every published state, by unit name and machine: a state that was
    /// published again (even with the same value) has a higher one.
    pub fn state_revisions(&self) -> Result<BTreeMap<(String, String), Revision>> {
        let keys = self.registry.keys();
        let base = keys.states();
        let res = self
            .block_on(self.registry.raw_kv().range(&base, true, None))
            .context("listing unit states")?;
        let mut out = BTreeMap::new();
        for kv in res.kvs {
            let Some(Key::State { machine, unit }) = Key::parse(keys, &kv.key) else {
                bail!("malformed state key {}", kv.key);
            };
            out.insert((unit.to_string(), machine.to_string()), kv.mod_revision);
        }
        Ok(out)
    }

    /// The canonical text stored for `hash`: what an agent writes into its units directory.
    pub fn canonical_text(&self, hash: &UnitHash) -> Result<String> {
        let file = self
            .block_on(self.registry.file(hash))?
            .with_context(|| format!("no file {hash} in the registry"))?;
        Ok(file.canonical())
    }

    /// Writes `value` at `key` verbatim (e.g. to corrupt a record on purpose).
    pub fn put_raw(&self, key: &str, value: &[u8]) -> Result<()> {
        self.raw_txn(TxnOp::Put {
            key: key.to_owned(),
            value: value.to_vec(),
            lease: None,
        })
    }

    /// Deletes `key`.
    pub fn delete_raw(&self, key: &str) -> Result<()> {
        self.raw_txn(TxnOp::Delete {
            key: key.to_owned(),
            prefix: false,
        })
    }

    fn raw_txn(&self, op: TxnOp) -> Result<()> {
        let txn = Txn {
            compares: vec![],
            success: vec![op],
            failure: vec![],
        };
        self.block_on(self.registry.raw_kv().txn(txn))
            .context("raw etcd write")?;
        Ok(())
    }
}
