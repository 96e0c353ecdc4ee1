//! The events a run left in etcd: how many keys and bytes, and which writers and kinds.

use anyhow::{Context, Result};
use fleet_registry::kv::{KeyValue, Kv};
use fleet_registry::{DEFAULT_PREFIX, Keys};

use super::Sim;

impl Sim {
    /// The keys of events in etcd now (a key holds one event or several of one subject): how
    /// many, and their keys' and values' bytes.
    pub async fn event_space(&self) -> Result<(u64, u64)> {
        let prefix = Keys::new(DEFAULT_PREFIX).events();
        let found = self
            .conns
            .monitor
            .range(&prefix, true, None)
            .await
            .context("reading the events")?;
        let bytes = found
            .kvs
            .iter()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum::<usize>();
        println!(
            "scale: events by writer and kind: {}",
            event_breakdown(&prefix, &found.kvs)
        );
        Ok((found.kvs.len() as u64, bytes as u64))
    }
}

/// How many events each writer (`user`, `engine`, `machine`) holds of each kind, as
/// `user/submitted 100000, …` (a key holds one event, or an array of one subject's), and the
/// keys holding more than one: which events a launch's keys are.
fn event_breakdown(prefix: &str, kvs: &[KeyValue]) -> String {
    #[derive(serde::Deserialize)]
    struct Kind {
        kind: String,
    }
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Value {
        One(Kind),
        Many(Vec<Kind>),
    }
    let mut counts = std::collections::BTreeMap::<(String, String), u64>::new();
    let mut shared = 0;
    for kv in kvs {
        let rest = kv.key.strip_prefix(prefix).unwrap_or(&kv.key);
        let writer = rest.split('/').next().unwrap_or("?").to_owned();
        let kinds = match serde_json::from_slice::<Value>(&kv.value) {
            Ok(Value::One(k)) => vec![k.kind],
            Ok(Value::Many(ks)) => {
                shared += 1;
                ks.into_iter().map(|k| k.kind).collect()
            }
            Err(_) => vec!["?".to_owned()],
        };
        for kind in kinds {
            *counts.entry((writer.clone(), kind)).or_default() += 1;
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|((w, k), n)| format!("{w}/{k} {n}"))
        .collect();
    format!("{}; keys holding several: {shared}", parts.join(", "))
}
