//! Dynamic machine metadata: what `PATCH /fleet/v1/machines` sets, stored apart from the
//! machines' presence records so that it survives a machine leaving and rejoining, may be set
//! for a machine not registered yet, and wins over the machine's configured value of the same
//! key. One key per machine and metadata key, no lease; a patch is one transaction.
//!
//! [`apply_dynamic`] is the one place where dynamic metadata meets the configured metadata:
//! the engine's view ([`Snapshot::machines_with_metadata`]) and every machine listing
//! ([`Registry::machines`], behind fleetctl's list-machines and the API's `GET /machines`)
//! go through it, so the scheduler never acts on other metadata than users are shown.
//!
//! [`Snapshot::machines_with_metadata`]: crate::Snapshot::machines_with_metadata

use fleet_core::{MachineId, MachineInfo};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{RegistryError, Result};
use crate::keys::{Key, Keys};
use crate::kv::{KeyValue, Kv, MAX_TXN_OPS, Revision, Txn, TxnOp};
use crate::read::{self, Listing, Skipped};
use crate::registry::Registry;
use crate::units::UnitsRole;

/// Every machine's dynamic metadata: machine -> key -> value. Machines not registered may
/// have some; it applies once they register.
pub type DynamicMetadata = BTreeMap<MachineId, BTreeMap<String, String>>;

/// Puts `machine`'s dynamic metadata over its configured metadata: a dynamic value wins
/// over the configured value of the same key, the other configured keys stay.
pub fn apply_dynamic(machine: &mut MachineInfo, dynamic: &DynamicMetadata) {
    if let Some(values) = dynamic.get(&machine.id) {
        for (key, value) in values {
            machine.metadata.insert(key.clone(), value.clone());
        }
    }
}

/// A stored dynamic metadata value, with the machine and metadata key its key names.
pub(crate) fn read(keys: &Keys, kv: &KeyValue) -> Result<(MachineId, String, String), Skipped> {
    let Some(Key::Metadata { machine, key }) = Key::parse(keys, &kv.key) else {
        return Err(read::skipped(keys, kv, "not a machine and metadata key"));
    };
    let value = String::from_utf8(kv.value.clone())
        .map_err(|_| read::skipped(keys, kv, "the value is not UTF-8"))?;
    Ok((machine, key.0, value))
}

/// A metadata key as fleet's API accepts it: `[A-Za-z0-9_.-]+`, so it can never split an
/// etcd key or a `key=value` list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MetadataKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metadata key {0:?} must be letters, digits, '_', '.' or '-'")]
pub struct MetadataKeyError(pub String);

impl FromStr for MetadataKey {
    type Err = MetadataKeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = !s.is_empty()
            && s.len() <= 255
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if ok {
            Ok(MetadataKey(s.to_owned()))
        } else {
            Err(MetadataKeyError(s.to_owned()))
        }
    }
}

impl MetadataKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MetadataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One change of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataChange {
    Set {
        machine: MachineId,
        key: MetadataKey,
        value: String,
    },
    Remove {
        machine: MachineId,
        key: MetadataKey,
    },
}

impl MetadataChange {
    fn target(&self) -> (&MachineId, &MetadataKey) {
        match self {
            Self::Set { machine, key, .. } | Self::Remove { machine, key } => (machine, key),
        }
    }
}

impl<K: Kv> Registry<K> {
    /// Every machine's dynamic metadata, at one revision. A value that is not UTF-8, or a key
    /// that names no machine and metadata key, is skipped.
    pub async fn dynamic_metadata(&self) -> Result<Listing<DynamicMetadata>> {
        self.dynamic_metadata_at(None).await
    }

    /// As [`dynamic_metadata`](Self::dynamic_metadata), at `revision` when given.
    pub(crate) async fn dynamic_metadata_at(
        &self,
        revision: Option<Revision>,
    ) -> Result<Listing<DynamicMetadata>> {
        let res = self
            .kv()
            .range(&self.keys().metadata_all(), true, revision)
            .await
            .map_err(RegistryError::kv("reading machine metadata"))?;
        let mut items = DynamicMetadata::new();
        let mut skipped = Vec::new();
        for kv in &res.kvs {
            match read(self.keys(), kv) {
                Ok((machine, key, value)) => {
                    items.entry(machine).or_default().insert(key, value);
                }
                Err(s) => skipped.push(s),
            }
        }
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }
}

/// The largest dynamic metadata value: a machine's metadata is matched by units'
/// `MachineMetadata=` and shown in listings, and a whole change of [`MAX_TXN_OPS`] values
/// stays far below etcd's request limit (issue 38: a 3.85 MB value was etcd's 500).
pub const MAX_METADATA_VALUE_BYTES: usize = 4096;

/// Metadata is written by the API, through the units role (docs/registry.md, Roles).
impl<K: Kv> UnitsRole<K> {
    /// Applies `changes` in one transaction, all or nothing; of several changes to one key
    /// the last wins (etcd refuses a transaction that names a key twice). At most
    /// [`MAX_TXN_OPS`] distinct keys, each value at most [`MAX_METADATA_VALUE_BYTES`].
    pub async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<()> {
        let mut last: BTreeMap<(&MachineId, &MetadataKey), &MetadataChange> = BTreeMap::new();
        for change in changes {
            if let MetadataChange::Set { value, .. } = change
                && value.len() > MAX_METADATA_VALUE_BYTES
            {
                return Err(RegistryError::ValueTooLarge {
                    what: "a metadata value",
                    size: value.len(),
                    max: MAX_METADATA_VALUE_BYTES,
                });
            }
            last.insert(change.target(), change);
        }
        if last.len() > MAX_TXN_OPS {
            return Err(RegistryError::TooManyChanges {
                count: last.len(),
                max: MAX_TXN_OPS,
            });
        }
        let success = last
            .into_iter()
            .map(|((machine, key), change)| {
                let key = self.registry().keys().metadata(machine, key.as_str());
                match change {
                    MetadataChange::Set { value, .. } => TxnOp::Put {
                        key,
                        value: value.clone().into_bytes(),
                        lease: None,
                    },
                    MetadataChange::Remove { .. } => TxnOp::Delete { key, prefix: false },
                }
            })
            .collect();
        let txn = Txn {
            compares: vec![],
            success,
            failure: vec![],
        };
        self.registry()
            .txn(txn, "changing machine metadata")
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::MemKv;

    fn set(machine: &str, key: &str, value: &str) -> MetadataChange {
        MetadataChange::Set {
            machine: machine.parse().unwrap(),
            key: key.parse().unwrap(),
            value: value.into(),
        }
    }

    fn remove(machine: &str, key: &str) -> MetadataChange {
        MetadataChange::Remove {
            machine: machine.parse().unwrap(),
            key: key.parse().unwrap(),
        }
    }

    #[tokio::test]
    async fn changes_apply_in_order_and_read_back_by_machine() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        UnitsRole::new(registry.clone())
            .change_metadata(&[
                set("m1", "tier", "api"),
                set("m1", "zone", "a"),
                set("m2", "tier", "db"),
                remove("m1", "zone"),
                set("m2", "tier", "web"),
            ])
            .await
            .unwrap();
        let listing = registry.dynamic_metadata().await.unwrap();
        let want: BTreeMap<MachineId, BTreeMap<String, String>> = [
            (
                "m1".parse().unwrap(),
                [("tier".to_owned(), "api".to_owned())].into(),
            ),
            (
                "m2".parse().unwrap(),
                [("tier".to_owned(), "web".to_owned())].into(),
            ),
        ]
        .into();
        assert_eq!(listing.items, want);
        assert!(listing.skipped.is_empty());
    }

    #[tokio::test]
    async fn a_patch_over_the_transaction_limit_writes_nothing() {
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let changes: Vec<MetadataChange> = (0..=MAX_TXN_OPS)
            .map(|i| set("m1", &format!("k{i}"), "v"))
            .collect();
        let err = UnitsRole::new(registry.clone())
            .change_metadata(&changes)
            .await
            .unwrap_err();
        assert!(matches!(err, RegistryError::TooManyChanges { .. }), "{err}");
        assert!(registry.dynamic_metadata().await.unwrap().items.is_empty());
    }

    fn info(id: &str, metadata: &[(&str, &str)]) -> MachineInfo {
        MachineInfo {
            id: id.parse().unwrap(),
            public_ip: String::new(),
            metadata: metadata
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            version: "test".into(),
            disable_engine: false,
            api: String::new(),
            fence_at: None,
        }
    }

    #[test]
    fn a_dynamic_value_wins_over_the_configured_one_and_other_keys_stay() {
        let mut m1 = info("m1", &[("tier", "web"), ("zone", "a")]);
        let dynamic: DynamicMetadata = [
            (
                "m1".parse().unwrap(),
                [("tier".into(), "api".into())].into(),
            ),
            ("m9".parse().unwrap(), [("zone".into(), "b".into())].into()),
        ]
        .into();
        apply_dynamic(&mut m1, &dynamic);
        assert_eq!(m1, info("m1", &[("tier", "api"), ("zone", "a")]));
        let mut m2 = info("m2", &[("zone", "a")]);
        apply_dynamic(&mut m2, &dynamic);
        assert_eq!(m2, info("m2", &[("zone", "a")]), "another machine's values");
    }

    #[tokio::test(start_paused = true)]
    async fn listings_snapshots_and_the_live_view_merge_alike() {
        use crate::LiveView;
        let registry = Registry::new(MemKv::new(), "/fleet/");
        let m1 = info("m1", &[("tier", "web")]);
        let ttl = std::time::Duration::from_secs(60);
        let machine = crate::MachineRole::new(registry.clone(), m1.id.clone());
        machine.register(&m1, ttl, None).await.unwrap();
        let units = UnitsRole::new(registry.clone());
        units
            .change_metadata(&[set("m1", "tier", "api"), set("m9", "early", "bird")])
            .await
            .unwrap();
        let merged = info("m1", &[("tier", "api")]);
        assert_eq!(
            registry.machines().await.unwrap().items,
            vec![merged.clone()]
        );
        let snap = registry.snapshot().await.unwrap();
        assert_eq!(snap.machines_with_metadata()[&m1.id], merged);
        assert_eq!(snap.machines[&m1.id], m1, "the record stays as configured");

        let mut view = LiveView::start_without_files(registry.clone())
            .await
            .unwrap();
        assert_eq!(view.snapshot().metadata, snap.metadata);
        units
            .change_metadata(&[remove("m1", "tier"), set("m9", "tier", "db")])
            .await
            .unwrap();
        let touched = view.changed().await.unwrap();
        assert!(touched.machines, "a metadata change wakes the engine");
        assert_eq!(view.snapshot().machines_with_metadata()[&m1.id], m1);
        assert_eq!(
            view.snapshot().metadata,
            registry.snapshot().await.unwrap().metadata
        );
    }

    #[test]
    fn metadata_keys_are_fleets_charset() {
        for ok in ["tier", "a.b-c_1"] {
            assert!(ok.parse::<MetadataKey>().is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "a=b", "a b", "ü"] {
            assert!(bad.parse::<MetadataKey>().is_err(), "{bad}");
        }
    }
}
