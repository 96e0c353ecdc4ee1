//! fleetd's `GET /metrics`, scraped over a machine's default API socket (the unix socket is
//! admin, so it answers whatever the cluster's roles), and the Prometheus text parsed.

use crate::Machine;
use anyhow::{Context, Result, ensure};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// How long one scrape may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One scrape: every sample, keyed by its series (`name{labels}` as written).
#[derive(Debug, Default)]
pub struct Scrape {
    pub samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// Parses the Prometheus text format (version 0.0.4): comments skipped, each other line
    /// `series value`, the labels' values free of spaces here.
    pub fn parse(text: &str) -> Result<Scrape> {
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (series, value) = line
                .rsplit_once(' ')
                .with_context(|| format!("no value in {line:?}"))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("bad value in {line:?}"))?;
            samples.insert(series.to_owned(), value);
        }
        Ok(Scrape { samples })
    }

    /// The sum of the samples of metric `name` whose labels include every one of `labels`
    /// (each `key="value"`).
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples
            .iter()
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series, ""));
                n == name && labels.iter().all(|l| rest.contains(l))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// `GET /metrics` over the machine's default API socket, as plain HTTP/1.1.
pub fn scrape(machine: &Machine) -> Result<Scrape> {
    let path = machine.api_socket();
    let mut stream =
        UnixStream::connect(&path).with_context(|| format!("connecting to {}", path.display()))?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: fleet\r\nConnection: close\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("no header end in {raw:?}"))?;
    ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
    ensure!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    ensure!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    Scrape::parse(body)
}
