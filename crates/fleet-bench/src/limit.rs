//! Scenario `limit` (issue 43): etcd's raw write rate on this machine, the floor under every
//! scale figure. A minimal client loop: 16 concurrent clients, each on its own connection,
//! each writing transactions of 128 puts (etcd's `--max-txn-ops` default) of 200-byte values
//! to keys of its own, without compares, on a fresh etcd. No fleet code runs but the etcd
//! client adapter itself.
//!
//! The scale scenarios call [`raw_time`] with the number of keys they wrote, on a fresh etcd
//! with their own flags, so each figure can be given as a ratio to what etcd alone needs for
//! the same keys.

use anyhow::{Context, Result};
use fleet_registry::MAX_TXN_OPS;
use fleet_registry::kv::{EtcdConfig, EtcdKv, Kv, Txn, TxnOp};
use fleet_testing::{Shaped, TestEtcd};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::report::{self, Table, secs};
use crate::shape::{ETCD_DEFAULT_ELECTIONS, deploy_etcd_args, etcd_args_from_env};

/// Concurrent clients.
pub const CLIENTS: usize = 16;
/// Bytes of each value.
pub const VALUE_BYTES: usize = 200;

/// One raw measurement.
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    pub keys: u64,
    pub took: Duration,
    pub etcd_cpu: f64,
}

impl Raw {
    pub fn keys_per_second(&self) -> f64 {
        self.keys as f64 / self.took.as_secs_f64().max(1e-9)
    }
}

/// How long etcd with `etcd_args` takes to accept `keys` keys from the raw loop, its
/// clients over TLS with client certificates when `tls` (as the production shape's are).
pub async fn raw_time(keys: u64, etcd_args: &[String], tls: bool) -> Result<Raw> {
    let etcd = TestEtcd::start_shaped(Shaped {
        tls,
        args: etcd_args,
        ..Shaped::default()
    })
    .await;
    let config = EtcdConfig {
        request_timeout: Duration::from_secs(60),
        ..etcd.config()
    };
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(
            EtcdKv::connect(&config)
                .await
                .context("connecting to etcd")?,
        );
    }
    let before = Metrics::fetch(&etcd.metrics_endpoint())?;
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(CLIENTS);
    for (c, kv) in clients.into_iter().enumerate() {
        let share = keys / CLIENTS as u64 + u64::from((c as u64) < keys % CLIENTS as u64);
        tasks.push(tokio::spawn(write(kv, c, share)));
    }
    for task in tasks {
        task.await.context("a raw writer panicked")??;
    }
    let took = t0.elapsed();
    let after = Metrics::fetch(&etcd.metrics_endpoint())?;
    let cpu = |m: &Metrics| m.sum("process_cpu_seconds_total", &[]);
    Ok(Raw {
        keys,
        took,
        etcd_cpu: cpu(&after) - cpu(&before),
    })
}

/// Client `c` writes `keys` keys, [`MAX_TXN_OPS`] a transaction.
async fn write(kv: EtcdKv, c: usize, keys: u64) -> Result<()> {
    let value = vec![b'v'; VALUE_BYTES];
    let mut n = 0u64;
    while n < keys {
        let batch = (keys - n).min(MAX_TXN_OPS as u64);
        let success = (n..n + batch)
            .map(|i| TxnOp::Put {
                key: format!("/limit/{c:02}/{i:09}"),
                value: value.clone(),
                lease: None,
            })
            .collect();
        let txn = Txn {
            compares: vec![],
            success,
            failure: vec![],
        };
        kv.txn(txn).await.context("a raw write")?;
        n += batch;
    }
    Ok(())
}

/// `bench / raw`, as the scale scenarios print their figures: `4.2× etcd's raw time`.
pub fn ratio(took: Duration, raw: &Raw) -> String {
    format!(
        "{:.1}× etcd's raw time ({} for {} keys)",
        took.as_secs_f64() / raw.took.as_secs_f64().max(1e-9),
        secs(raw.took),
        raw.keys
    )
}

/// Runs the scenario: `keys` keys with docs/deploy.md's flags (the production shape's) and
/// with etcd's defaults; the lab's flags are printed with them when they differ.
pub async fn run(keys: u64) -> Result<String> {
    let wall = SystemTime::now();
    let started = Instant::now();
    let extra = Vec::new();
    let mut sets = vec![
        (
            "docs/deploy.md's over TLS (production shape)",
            deploy_etcd_args(&extra),
            true,
        ),
        ("docs/deploy.md's", deploy_etcd_args(&extra), false),
        (
            "etcd's defaults",
            ETCD_DEFAULT_ELECTIONS.map(str::to_owned).to_vec(),
            false,
        ),
    ];
    let lab = etcd_args_from_env();
    if !sets.iter().any(|(_, a, tls)| *a == lab && !tls) {
        sets.push(("the lab shape's", lab, false));
    }
    let mut t = Table::new(&["etcd flags", "keys", "took", "keys / s", "etcd CPU"]);
    for (name, args, tls) in &sets {
        println!("limit: {keys} keys with {name} flags");
        let raw = raw_time(keys, args, *tls).await?;
        println!(
            "limit: {keys} keys in {} ({:.0} keys/s)",
            secs(raw.took),
            raw.keys_per_second()
        );
        let flags = format!("{name}: `{}`", args.join(" "));
        t.row(vec![
            flags,
            keys.to_string(),
            secs(raw.took),
            format!("{:.0}", raw.keys_per_second()),
            format!("{:.1} s", raw.etcd_cpu),
        ]);
    }
    let mut out = report::provenance(wall, started.elapsed());
    out.push_str(&format!(
        "\n{CLIENTS} clients, each on its own connection, writing transactions of \
         {MAX_TXN_OPS} puts of {VALUE_BYTES}-byte values without compares, on a fresh etcd. \
         etcd's defaults are its own election timings, which the test harness otherwise makes \
         faster; the lab shape runs with the harness's.\n\n"
    ));
    out.push_str(&t.render());
    Ok(out)
}
