//! `fleetctl import-fleet`: reads fleet v1's registry from its etcd's v2 keyspace, plans
//! ([`crate::import::plan`]), prints one line per unit and a summary, and, unless
//! `--dry-run`, writes what the plan says into ours: first the migration mark of every machine
//! it places units on, then each unit with its placement in one transaction
//! ([`fleet_registry::Importer`]). Writing straight into the registry (schedule entries
//! included), it needs the etcd driver and credentials that may write schedules
//! (docs/migrating.md).

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use fleet_core::{MachineId, UnitHash, UnitName};
use fleet_registry::kv::{Kv, TlsFiles};
use fleet_registry::{ImportOutcome, ImportedUnit, Importer, MigrationRecord, Registry, Unit};
use std::collections::BTreeMap;
use std::time::Duration;

use super::Ctx;
use crate::cli::ImportFleetArgs;
use crate::driver::transport::Transport;
use crate::import::plan::{Import, Verdict, plan};
use crate::import::v2::FleetRegistry;

/// Reads fleet's registry from the first of `--from`'s URLs that answers.
pub async fn read_fleet(args: &ImportFleetArgs, timeout: Duration) -> Result<FleetRegistry> {
    let tls = TlsFiles {
        ca_file: args.from_ca_file.clone(),
        cert_file: args.from_cert_file.clone(),
        key_file: args.from_key_file.clone(),
    };
    let authorization = match (&args.from_username, &args.from_password_file) {
        (Some(user), Some(file)) => {
            let password = crate::credentials::read_password(file)?;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            Some(format!("Basic {token}"))
        }
        _ => None,
    };
    let prefix = format!("/{}/", args.from_prefix.trim_matches('/'));
    let path = format!("/v2/keys{prefix}?recursive=true&sorted=true");
    let mut failures = Vec::new();
    for url in args
        .from
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
    {
        let transport = Transport::new(url, &tls, timeout)?.not_fleetd();
        match transport.get_raw(&path, authorization.as_deref()).await {
            Ok(answer) if answer.status.is_success() || answer.status.as_u16() == 404 => {
                return FleetRegistry::from_v2(&answer.body, &prefix)
                    .with_context(|| format!("reading fleet's registry at {url}"));
            }
            Ok(answer) => failures.push(format!(
                "{url}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body).trim()
            )),
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    bail!(
        "no etcd of fleet v1 answered (is its v2 API on? etcd 3.x needs --enable-v2): {}",
        failures.join("; ")
    )
}

/// Plans, prints and (unless `dry_run`) writes the import of `fleet` into `registry`.
pub async fn run<K: Kv>(
    ctx: &mut Ctx<()>,
    registry: &Registry<K>,
    fleet: &FleetRegistry,
    dry_run: bool,
    replace: bool,
) -> Result<()> {
    let listing = registry.units().await.context("reading our units")?;
    let ours: BTreeMap<UnitName, Unit> = listing
        .items
        .into_iter()
        .map(|u| (u.name().clone(), u))
        .collect();
    let hashes: BTreeMap<UnitName, UnitHash> =
        ours.iter().map(|(n, u)| (n.clone(), u.hash())).collect();
    let verdicts = plan(fleet, &hashes, replace);
    let mut counts = Counts::default();
    for verdict in &verdicts {
        ctx.say(line(verdict));
        counts.add(verdict);
    }
    if !dry_run {
        counts.failed = write(ctx, registry, &verdicts, &ours).await?;
    }
    ctx.say(counts.summary(dry_run));
    if counts.refused + counts.failed > 0 {
        bail!(
            "{} of fleet's units were not imported (each is named above with why)",
            counts.refused + counts.failed
        );
    }
    Ok(())
}

/// Marks the machines, then writes each unit; how many could not be written.
async fn write<K: Kv>(
    ctx: &mut Ctx<()>,
    registry: &Registry<K>,
    verdicts: &[Verdict],
    ours: &BTreeMap<UnitName, Unit>,
) -> Result<usize> {
    let importer = Importer::new(registry.clone());
    let imports: Vec<&Import> = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Import(i) => Some(i),
            Verdict::Unchanged { .. } | Verdict::Refused { .. } => None,
        })
        .collect();
    let mut per_machine: BTreeMap<&MachineId, u64> = BTreeMap::new();
    for import in &imports {
        for machine in import.machine.iter().chain(&import.global_on) {
            *per_machine.entry(machine).or_default() += 1;
        }
    }
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    for (machine, units) in per_machine {
        let record = MigrationRecord {
            machine: machine.clone(),
            since,
            units,
        };
        importer
            .mark_migrating(&record)
            .await
            .with_context(|| format!("marking machine {machine} migrating; nothing imported"))?;
    }
    let mut failed = 0;
    for import in imports {
        let unit = ImportedUnit {
            name: import.name.clone(),
            file: import.file.clone(),
            desired: import.desired,
            machines: import
                .machine
                .iter()
                .chain(&import.global_on)
                .cloned()
                .collect(),
        };
        let existing = import.replaces.and(ours.get(&import.name));
        match importer.import_unit(&unit, existing).await {
            Ok(ImportOutcome::Written(_)) => {}
            Ok(ImportOutcome::Conflict) => {
                failed += 1;
                ctx.warn(format!(
                    "Not imported {}: it changed in ours while importing; run again",
                    import.name
                ));
            }
            Err(e) => {
                return Err(anyhow!(e)).with_context(|| format!("importing {}", import.name));
            }
        }
    }
    Ok(failed)
}

/// The line printed for one unit.
fn line(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Import(i) => {
            let placed = match (&i.machine, i.global_on.len()) {
                (Some(m), _) => format!(" on {}…", m.short()),
                (None, 0) if i.desired == fleet_core::DesiredState::Inactive => String::new(),
                (None, 0) => ", placed by our engine".to_owned(),
                (None, n) => format!(", global, on {n} machines"),
            };
            format!("Imported {}: {}{placed}", i.name, i.desired)
        }
        Verdict::Unchanged { name } => format!("Unchanged {name}: ours has it with the same file"),
        Verdict::Refused { name, reason } => format!("Refused {name}: {reason}"),
    }
}

#[derive(Debug, Default)]
struct Counts {
    imported: usize,
    unchanged: usize,
    refused: usize,
    failed: usize,
}

impl Counts {
    fn add(&mut self, verdict: &Verdict) {
        match verdict {
            Verdict::Import(_) => self.imported += 1,
            Verdict::Unchanged { .. } => self.unchanged += 1,
            Verdict::Refused { .. } => self.refused += 1,
        }
    }

    fn summary(&self, dry_run: bool) -> String {
        let total = self.imported + self.unchanged + self.refused;
        let written = if dry_run {
            "; dry run: nothing was written".to_owned()
        } else if self.failed > 0 {
            format!("; {} not written", self.failed)
        } else {
            String::new()
        };
        format!(
            "fleet holds {total} units: {} imported, {} unchanged, {} refused{written}",
            self.imported, self.unchanged, self.refused
        )
    }
}
