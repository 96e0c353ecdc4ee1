//! etcd's own Prometheus counters (`GET /metrics` on its client URL): requests handled by gRPC
//! method, its CPU time and memory. Read before and after a phase, they count what every
//! client did, including processes the benchmark cannot wrap (fleetctl, fleetd).

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// One scrape: every sample line, `name{labels}` -> value.
#[derive(Debug, Clone, Default)]
pub struct Metrics(BTreeMap<String, f64>);

impl Metrics {
    /// Scrapes `endpoint` (`http://host:port`).
    pub fn fetch(endpoint: &str) -> Result<Metrics> {
        let addr = endpoint
            .strip_prefix("http://")
            .with_context(|| format!("{endpoint} is not an http:// URL"))?
            .trim_end_matches('/');
        let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut body = String::new();
        stream.read_to_string(&mut body)?;
        if !body.starts_with("HTTP/1.") {
            bail!("unexpected answer from {addr}/metrics");
        }
        Ok(Metrics::parse(&body))
    }

    fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Metrics(samples)
    }

    /// The sum of every sample of `name` whose labels contain all of `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.split('{').next() == Some(name))
            .filter(|(k, _)| {
                labels
                    .iter()
                    .all(|(l, v)| k.contains(&format!("{l}=\"{v}\"")))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// gRPC requests etcd answered, by method (`Range`, `Txn`, `Watch`, `LeaseKeepAlive`, ...).
    pub fn grpc_by_method(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            if !k.starts_with("grpc_server_handled_total{")
                && !k.starts_with("grpc_server_msg_received_total{")
            {
                continue;
            }
            let Some(method) = label(k, "grpc_method") else {
                continue;
            };
            let kind = if k.starts_with("grpc_server_handled_total") {
                "handled"
            } else {
                "received"
            };
            *out.entry(format!("{kind}:{method}")).or_insert(0.0) += v;
        }
        out
    }
}

fn label<'a>(sample: &'a str, name: &str) -> Option<&'a str> {
    let start = sample.find(&format!("{name}=\""))? + name.len() + 2;
    let len = sample[start..].find('"')?;
    Some(&sample[start..start + len])
}

/// Messages etcd received, by gRPC method, between two scrapes. Unary calls (Range, Txn,
/// LeaseGrant, ...) are one message each; on streams (Watch, LeaseKeepAlive) each message is
/// one watch creation or one lease refresh.
pub fn received_between(before: &Metrics, after: &Metrics) -> BTreeMap<String, u64> {
    let (b, a) = (before.grpc_by_method(), after.grpc_by_method());
    a.iter()
        .filter_map(|(k, v)| {
            let method = k.strip_prefix("received:")?;
            let n = (v - b.get(k).copied().unwrap_or(0.0)).round() as u64;
            (n > 0).then(|| (method.to_owned(), n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# HELP x\n\
        grpc_server_msg_received_total{grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 12\n\
        grpc_server_msg_received_total{grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3\n\
        process_cpu_seconds_total 1.5\n";

    #[test]
    fn reads_samples_and_sums_them_by_label() {
        let m = Metrics::parse(SAMPLE);
        assert_eq!(m.sum("process_cpu_seconds_total", &[]), 1.5);
        assert_eq!(
            m.sum(
                "grpc_server_msg_received_total",
                &[("grpc_method", "Range")]
            ),
            12.0
        );
        let none = Metrics::default();
        let diff = received_between(&none, &m);
        assert_eq!(diff.get("Range"), Some(&12));
        assert_eq!(diff.get("Txn"), Some(&3));
    }
}
