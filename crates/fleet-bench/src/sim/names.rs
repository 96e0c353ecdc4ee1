//! The simulation's names and records: machine IDs, benchmark units, machine records, and
//! registering every machine.

use anyhow::{Context, Result, bail};
use fleet_agent::PresenceKeeper;
use fleet_core::{MachineId, MachineInfo, UnitFile, UnitName};
use fleet_registry::Presence;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A machine ID like systemd's (32 hex digits), distinct in its first 8 (fleet's short form).
pub fn machine_id(i: usize) -> MachineId {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    format!("{:08x}{:024x}", (x >> 32) as u32, i)
        .parse()
        .expect("hex digits make a machine ID")
}

/// Unit `i` of a benchmark, in generation `generation` (a new generation is new content).
pub fn bench_unit(i: usize, generation: u32) -> (UnitName, UnitFile) {
    let name: UnitName = format!("bench-{i:05}.service")
        .parse()
        .expect("a valid unit name");
    let file = UnitFile::parse(unit_text(i, generation).as_bytes()).expect("a valid unit file");
    (name, file)
}

/// The text of benchmark unit `i`: a service that only sleeps.
pub fn unit_text(i: usize, generation: u32) -> String {
    format!(
        "[Unit]\nDescription=fleet bench unit {i} generation {generation}\n\n\
         [Service]\nExecStart=/bin/sleep infinity\n"
    )
}

/// Simulated machine `i`'s record.
pub(super) fn machine_info(i: usize) -> MachineInfo {
    MachineInfo {
        id: machine_id(i),
        public_ip: format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
        metadata: BTreeMap::from([("sim".to_owned(), "yes".to_owned())]),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    }
}

/// Registers every machine with its keeper, 64 at a time, as fleetd does (retrying each
/// failure with its backoff); gives up after `within`, saying how many registered. With
/// etcd's auth on, each machine's first request logs it in (a bcrypt comparison in etcd):
/// too many at once on a slow etcd and registration takes minutes, so the bound turns that
/// into a figure instead of a hang.
pub(super) async fn register<K: fleet_registry::kv::Kv>(
    keepers: impl Iterator<Item = PresenceKeeper<K>>,
    within: Duration,
) -> Result<Vec<(PresenceKeeper<K>, Presence)>> {
    let done = AtomicUsize::new(0);
    let all = futures::stream::iter(keepers)
        .map(|keeper| async {
            let presence = keeper.register().await?;
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<_, fleet_registry::RegistryError>((keeper, presence))
        })
        .buffered(64)
        .collect::<Vec<_>>();
    let Ok(results) = tokio::time::timeout(within, all).await else {
        bail!(
            "only {} machines registered within {within:?} (with etcd's auth on, each logs in \
             first: etcd's --bcrypt-cost, docs/deploy.md)",
            done.load(Ordering::Relaxed)
        );
    };
    results
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("registering simulated machines")
}
