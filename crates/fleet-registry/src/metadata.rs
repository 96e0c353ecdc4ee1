//! Dynamic machine metadata: what `PATCH /fleet/v1/machines` sets, stored apart from the
//! machines' presence records so that it survives a machine leaving and rejoining, may be set
//! for a machine not registered yet, and wins over the machine's configured value of the same
//! key. One key per machine and metadata key, no lease; a patch is one transaction.

use fleet_core::MachineId;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{RegistryError, Result};
use crate::kv::{Kv, Txn, TxnOp};
use crate::leader::MAX_TXN_OPS;
use crate::read::{Listing, Skipped};
use crate::registry::Registry;

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
    pub async fn dynamic_metadata(
        &self,
    ) -> Result<Listing<BTreeMap<MachineId, BTreeMap<String, String>>>> {
        let base = self.keys().metadata_all();
        let res = self
            .kv()
            .range(&base, true, None)
            .await
            .map_err(RegistryError::kv("reading machine metadata"))?;
        let mut items: BTreeMap<MachineId, BTreeMap<String, String>> = BTreeMap::new();
        let mut skipped = Vec::new();
        for kv in &res.kvs {
            let parsed = kv.key.strip_prefix(&base).and_then(|rest| {
                let (machine, key) = rest.split_once('/')?;
                let machine: MachineId = machine.parse().ok()?;
                let key: MetadataKey = key.parse().ok()?;
                let value = String::from_utf8(kv.value.clone()).ok()?;
                Some((machine, key, value))
            });
            match parsed {
                Some((machine, key, value)) => {
                    items.entry(machine).or_default().insert(key.0, value);
                }
                None => skipped.push(Skipped {
                    key: kv.key.clone(),
                    mod_revision: kv.mod_revision,
                    detail: "not a machine metadata key with a UTF-8 value".into(),
                    named: None,
                }),
            }
        }
        Ok(Listing {
            revision: res.revision,
            items,
            skipped,
        })
    }

    /// Applies `changes` in one transaction, all or nothing; of several changes to one key
    /// the last wins (etcd refuses a transaction that names a key twice). At most
    /// [`MAX_TXN_OPS`] distinct keys.
    pub async fn change_metadata(&self, changes: &[MetadataChange]) -> Result<()> {
        let mut last: BTreeMap<(&MachineId, &MetadataKey), &MetadataChange> = BTreeMap::new();
        for change in changes {
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
                let key = self.keys().metadata(machine, key.as_str());
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
        self.kv()
            .txn(txn)
            .await
            .map_err(RegistryError::kv("changing machine metadata"))?;
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
        registry
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
        let err = registry.change_metadata(&changes).await.unwrap_err();
        assert!(matches!(err, RegistryError::TooManyChanges { .. }), "{err}");
        assert!(registry.dynamic_metadata().await.unwrap().items.is_empty());
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
