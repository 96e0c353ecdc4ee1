//! `fleetctl import-fleet`: reads fleet v1's registry from its etcd's v2 keyspace, reads our
//! units over either driver, plans ([`crate::import::plan`]), prints one line per unit and a
//! summary, and, unless `--dry-run`, writes what the plan says into ours: first the migration
//! mark of every machine it places units on, then each unit with its placement in one
//! transaction ([`fleet_registry::Importer::apply`]). The etcd driver writes that itself,
//! with credentials that may write schedules; the API driver sends the plan to fleetd
//! (`POST /import`, admins only), which checks it and writes it the same way
//! (docs/migrating.md).

use anyhow::{Context, Result, bail};
use base64::Engine;
use fleet_core::{MachineId, UnitHash, UnitName};
use fleet_ops::Cluster;
use fleet_registry::kv::{Kv, TlsFiles};
use fleet_registry::{ImportOutcome, ImportPlan, ImportedUnit, Importer, MigrationRecord};
use std::collections::BTreeMap;
use std::time::Duration;

use super::Ctx;
use crate::cli::ImportFleetArgs;
use crate::driver::HttpCluster;
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

/// Where the plan is written: the registry itself (the etcd driver, through
/// [`Importer::apply`]), or a fleetd that writes it the same way (the API driver).
pub trait ImportWriter {
    /// Writes `plan`; for each of its units, in order, whether it was written (`false`: ours
    /// changed since the plan was made, and nothing of that unit was written).
    fn write(&self, plan: &ImportPlan) -> impl Future<Output = Result<Vec<bool>>>;
}

impl<K: Kv> ImportWriter for Importer<K> {
    async fn write(&self, plan: &ImportPlan) -> Result<Vec<bool>> {
        let outcomes = self.apply(plan).await?;
        Ok(outcomes
            .iter()
            .map(|o| matches!(o, ImportOutcome::Written(_)))
            .collect())
    }
}

impl ImportWriter for HttpCluster {
    async fn write(&self, plan: &ImportPlan) -> Result<Vec<bool>> {
        Ok(self.import(plan).await?)
    }
}

/// Plans from `fleet` and the units `ctx`'s cluster has, prints, and (unless `dry_run`)
/// writes the plan with `writer`.
pub async fn run<C: Cluster, W: ImportWriter>(
    ctx: &mut Ctx<C>,
    writer: &W,
    fleet: &FleetRegistry,
    dry_run: bool,
    replace: bool,
) -> Result<()> {
    let listing = ctx.cluster.units(None).await.context("reading our units")?;
    let hashes: BTreeMap<UnitName, UnitHash> = listing
        .units
        .iter()
        .map(|u| (u.name().clone(), u.file.hash()))
        .collect();
    let verdicts = plan(fleet, &hashes, replace);
    let mut counts = Counts::default();
    for verdict in &verdicts {
        ctx.say(line(verdict));
        counts.add(verdict);
    }
    if !dry_run {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let plan = import_plan(&verdicts, since);
        let written = writer.write(&plan).await.context(
            "writing the import into ours (what was written stays: run it again for the rest)",
        )?;
        for (unit, _) in plan.units.iter().zip(&written).filter(|(_, w)| !**w) {
            counts.failed += 1;
            ctx.warn(format!(
                "Not imported {}: it changed in ours while importing; run again",
                unit.name
            ));
        }
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

/// What the verdicts write: a migration mark for every machine that gets units (with how
/// many, `since` seconds after the epoch), and every imported unit with its machines.
pub fn import_plan(verdicts: &[Verdict], since: u64) -> ImportPlan {
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
    ImportPlan {
        marks: per_machine
            .into_iter()
            .map(|(machine, units)| MigrationRecord {
                machine: machine.clone(),
                since,
                units,
            })
            .collect(),
        units: imports
            .into_iter()
            .map(|import| ImportedUnit {
                name: import.name.clone(),
                file: import.file.clone(),
                desired: import.desired,
                machines: import
                    .machine
                    .iter()
                    .chain(&import.global_on)
                    .cloned()
                    .collect(),
                replaces: import.replaces,
            })
            .collect(),
    }
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
