//! Getting units into the registry (`submit`, and the first step of `load`/`start`):
//! resolve every argument to content, decide create / replace / keep, and only when every
//! argument is valid write them all: the new units together ([`Cluster::create_many`], many
//! per etcd transaction), the replaced ones together too, each conditional on the record read
//! ([`Cluster::put_many_if`]). A write that fails
//! midway leaves what was written before it; the command says how many were not written, and
//! running it again writes only those (docs/guarantees.md).

use anyhow::{Context, Result, anyhow, bail};
use fleet_core::{DesiredState, Requirements, UnitFile, UnitHash, UnitName};
use fleet_ops::{Cluster, Expect, PutOutcome, PutRequest, ReplaceHow, UnitStatus, UnitView};
use fleet_registry::input::shorten;
use std::collections::{BTreeMap, BTreeSet};

pub use crate::plan::{Action, Prepared};

use super::Ctx;
use crate::local::{local_path, local_template_path, peek_unit_file, read_unit_file};

/// Which command is creating units: it decides in which desired states `--replace` may act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Submit,
    Load,
    Start,
}

impl Verb {
    /// fleet's rule: submit replaces only inactive units, load inactive or loaded, start any;
    /// that is, a replace never lowers the desired state ([`fleet_ops::decide::replace_lowers`],
    /// which the API applies to every `PUT`).
    fn may_replace(self, desired: DesiredState) -> bool {
        !fleet_ops::decide::replace_lowers(desired, super::lifecycle::target_of(self))
    }
}

/// The cluster as `prepare` reads it. With several arguments, the units they name (and their
/// templates) are read together the first time one is needed, instead of one request per
/// argument, one after the other (fleetctl spent 6.7-7.1 s of 17 s writing 10,000 units,
/// docs/benchmarks.md item 4). Each unit comes with its file, so a template's file is read
/// once however many instances take it, and `load`/`start` tell global units by the files
/// kept here.
struct Registered<C> {
    cluster: C,
    /// The names read together.
    names: BTreeSet<UnitName>,
    units: Option<BTreeMap<UnitName, UnitView>>,
    /// The file of every unit read, by hash.
    files: BTreeMap<UnitHash, UnitFile>,
}

impl<C: Cluster> Registered<C> {
    fn new(cluster: C, args: &[String]) -> Registered<C> {
        let mut names = BTreeSet::new();
        if args.len() > 1 {
            // Arguments that do not parse fail in `prepare`, in their turn.
            for name in args.iter().filter_map(|a| UnitName::from_arg(a).ok()) {
                names.extend(name.template());
                names.insert(name);
            }
        }
        Registered {
            cluster,
            names,
            units: None,
            files: BTreeMap::new(),
        }
    }

    /// The unit of `name` with its file, if there is one. A record that cannot be read is
    /// left out of the listing (as `Cluster::unit` leaves it out): such an argument is then
    /// created, and the write fails on that record, in its turn.
    async fn unit(&mut self, name: &UnitName) -> Result<Option<UnitView>> {
        if self.units.is_none() && self.names.contains(name) {
            let listing = self.cluster.units(Some(&self.names)).await?;
            let units = listing.units.into_iter();
            self.units = Some(units.map(|u| (u.name().clone(), u)).collect());
        }
        let unit = match &self.units {
            Some(units) if self.names.contains(name) => units.get(name).cloned(),
            _ => self.cluster.unit(name).await?,
        };
        if let Some(unit) = &unit {
            self.files.insert(unit.status.hash, unit.file.clone());
        }
        Ok(unit)
    }
}

/// Resolves every argument without writing anything. Warnings go to `ctx` as fleet prints
/// them; the first invalid argument fails the whole command.
pub async fn prepare<C: Cluster>(
    ctx: &mut Ctx<C>,
    args: &[String],
    replace: bool,
    verb: Verb,
) -> Result<Vec<Prepared>> {
    Ok(resolve(ctx, args, replace, verb).await?.prepared)
}

/// What [`resolve`] found.
#[derive(Debug)]
pub struct Resolved {
    pub prepared: Vec<Prepared>,
    /// The file of every registered unit read, by hash.
    pub files: BTreeMap<UnitHash, UnitFile>,
    /// Units kept as the registry has them although their local file (or template) differs:
    /// without `--replace`, each was warned about.
    pub differing: Vec<UnitName>,
}

/// [`prepare`], with the file of every registered unit it read and the units whose local
/// file differs from the registry's.
pub async fn resolve<C: Cluster>(
    ctx: &mut Ctx<C>,
    args: &[String],
    replace: bool,
    verb: Verb,
) -> Result<Resolved> {
    if args.is_empty() {
        bail!("No units given");
    }
    let mut registered = Registered::new(ctx.cluster.clone(), args);
    let mut prepared = Vec::with_capacity(args.len());
    let mut differing = Vec::new();
    // The first argument naming each unit: a later one is the same unit, acted on once.
    let mut first: BTreeMap<UnitName, &str> = BTreeMap::new();
    for arg in args {
        let name = super::parse_arg(arg)?;
        if let Some(earlier) = first.get(&name) {
            same_content_twice(&name, earlier, arg)?;
            continue;
        }
        first.insert(name.clone(), arg);
        if fleet_ops::decide::template_check(&name, super::lifecycle::target_of(verb)).is_err() {
            bail!(
                "cannot activate template {name}: load or start an instance such as {}@1.{}",
                name.prefix(),
                name.unit_type().suffix()
            );
        }
        let unit = Argument { arg, name: &name };
        let action = prepare_one(ctx, &mut registered, unit, replace, verb, &mut differing).await?;
        prepared.push(Prepared { name, action });
    }
    Ok(Resolved {
        prepared,
        files: registered.files,
        differing,
    })
}

/// An argument and the unit it names.
#[derive(Debug, Clone, Copy)]
struct Argument<'a> {
    arg: &'a str,
    name: &'a UnitName,
}

/// The action for one argument. A unit kept although its local file differs (without
/// `--replace`) is warned about and added to `differing`.
async fn prepare_one<C: Cluster>(
    ctx: &mut Ctx<C>,
    registry: &mut Registered<C>,
    Argument { arg, name }: Argument<'_>,
    replace: bool,
    verb: Verb,
    differing: &mut Vec<UnitName>,
) -> Result<Action> {
    let existing = registry.unit(name).await?;
    let Some(existing) = existing else {
        let file = if replace {
            find_replacement(registry, arg, name).await?
        } else {
            find_new_content(ctx, registry, arg, name).await?
        };
        let file = file.ok_or_else(|| not_found(name, arg))?;
        check_requirements(ctx, name, &file)?;
        return Ok(Action::Create(file));
    };
    if !replace {
        if warn_if_local_differs(ctx, arg, name, &existing) {
            differing.push(name.clone());
        }
        return Ok(Action::Keep(existing.status));
    }
    let file = find_replacement(registry, arg, name)
        .await?
        .with_context(|| {
            format!(
                "cannot replace {name}: no local file {} and no template to take it from",
                local_path(arg).display()
            )
        })?;
    if fleet_ops::decide::content(Some(existing.status.hash), file.hash())
        == fleet_ops::decide::Content::Same
    {
        ctx.say(format!(
            "Found same Unit({name}) in Registry, nothing to do"
        ));
        return Ok(Action::Keep(existing.status));
    }
    if !verb.may_replace(existing.status.desired) {
        bail!(
            "can not replace Unit({name}) in state '{}', use the appropriate command",
            existing.status.desired
        );
    }
    check_requirements(ctx, name, &file)?;
    Ok(Action::Replace {
        existing: existing.status,
        file,
    })
}

/// Two arguments name one unit (`d1/col.service d2/col.service`): fine if their local files
/// say the same, refused before anything is written if they differ.
fn same_content_twice(name: &UnitName, earlier: &str, arg: &str) -> Result<()> {
    let read = |a: &str| read_local(a, name).map(|f| f.map(|(file, _)| file.hash()));
    match (read(earlier)?, read(arg)?) {
        (Some(a), Some(b)) if a != b => bail!(
            "{name} is given twice with different content ({} and {}); nothing was written",
            shorten(&local_path(earlier).to_string_lossy()),
            shorten(&local_path(arg).to_string_lossy())
        ),
        _ => Ok(()),
    }
}

/// Without `--replace` a registered unit is kept; a local file that says otherwise is
/// reported as fleet does, and `true` returned (`submit` then fails; `load` and `start` go on
/// with the registry's version). The local files are read for that comparison alone
/// (`peek_unit_file`), so one that cannot be read or parsed is passed over rather than
/// failing a command that would not have used it.
fn warn_if_local_differs<C>(
    ctx: &mut Ctx<C>,
    arg: &str,
    name: &UnitName,
    existing: &UnitView,
) -> bool {
    let own = local_path(arg);
    let local = if own.exists() {
        // The unit's own file decides what is compared, even when it is unreadable.
        peek_unit_file(&own).map(|f| (f, LocalKind::File))
    } else {
        name.template()
            .and_then(|t| peek_unit_file(&local_template_path(arg, &t)))
            .map(|f| (f, LocalKind::Template))
    };
    if let Some((file, kind)) = local
        && fleet_ops::decide::content(Some(existing.status.hash), file.hash())
            == fleet_ops::decide::Content::Differs
    {
        // fleet names the argument here, even when the template is what differs.
        let shown = UnitName::with_default_type(arg);
        ctx.warn(differs_warning(name, kind, &shown));
        return true;
    }
    false
}

/// Which local file a registry unit was compared with, as the warning names it.
#[derive(Debug, Clone, Copy)]
enum LocalKind {
    File,
    Template,
}

/// fleet's warning for a registry unit that differs from a local file it will not take.
fn differs_warning(unit: &UnitName, kind: LocalKind, path: &str) -> String {
    let kind = match kind {
        LocalKind::File => "local unit file",
        LocalKind::Template => "local template unit file",
    };
    format!(
        "WARNING: Unit {unit} in registry differs from {kind} {path}. Add --replace to override."
    )
}

/// The local file to compare a registered unit with: its own, else its local template.
fn read_local(arg: &str, name: &UnitName) -> Result<Option<(UnitFile, bool)>> {
    if let Some(f) = read_unit_file(&local_path(arg))? {
        return Ok(Some((f, false)));
    }
    if let Some(template) = name.template()
        && let Some(f) = read_unit_file(&local_template_path(arg, &template))?
    {
        return Ok(Some((f, true)));
    }
    Ok(None)
}

/// Content for a unit not yet registered, in fleet's order: local file, registry template,
/// local template. A local template that differs from the registry's is not used, but said
/// (fleet#1560): `--replace` is how to take it.
async fn find_new_content<C: Cluster>(
    ctx: &mut Ctx<C>,
    registry: &mut Registered<C>,
    arg: &str,
    name: &UnitName,
) -> Result<Option<UnitFile>> {
    if let Some(f) = read_unit_file(&local_path(arg))? {
        return Ok(Some(f));
    }
    let Some(template) = name.template() else {
        return Ok(None);
    };
    let local_template = local_template_path(arg, &template);
    let Some(registered) = registry.unit(&template).await? else {
        // No registry template: the local one is the content, so it must be valid.
        return read_unit_file(&local_template)?
            .map(Some)
            .ok_or_else(|| no_template(name, &template));
    };
    let file = registered.file;
    // The registry's template is what gets used; the local one is read only to compare, so a
    // local template that cannot be read or parsed, or is a FIFO, is passed over, never fatal.
    if let Some(local) = peek_unit_file(&local_template)
        && local.hash() != file.hash()
    {
        let shown = local_template.display().to_string();
        ctx.warn(differs_warning(&template, LocalKind::Template, &shown));
    }
    Ok(Some(file))
}

/// Content for `--replace`: the local file decides (fleet#1691). The instance's own file,
/// then the template next to the argument, and the registry's template only when there is no
/// local one; fleet's order let a stale registry template win, so an edited local template
/// was "the same" and nothing happened.
async fn find_replacement<C: Cluster>(
    registry: &mut Registered<C>,
    arg: &str,
    name: &UnitName,
) -> Result<Option<UnitFile>> {
    if let Some((file, _)) = read_local(arg, name)? {
        return Ok(Some(file));
    }
    let Some(template) = name.template() else {
        return Ok(None);
    };
    match registry.unit(&template).await? {
        Some(unit) => Ok(Some(unit.file)),
        None => Err(no_template(name, &template)),
    }
}

fn no_template(name: &UnitName, template: &UnitName) -> anyhow::Error {
    anyhow!(
        "failed getting Unit({name}) from template: unable to find template Unit({template}) in Registry or on filesystem"
    )
}

fn not_found(name: &UnitName, arg: &str) -> anyhow::Error {
    let looked = local_path(arg);
    // `submit /dev/stdin` looked for /dev/stdin.service (issue 38): the file named is there,
    // but fleetctl takes a unit's name from its file's, and that name is no unit's.
    if looked.as_os_str() != arg && std::path::Path::new(arg).exists() {
        return anyhow!(
            "{:?} is not named as a unit file: fleetctl names a unit after its file, and found \
             no {:?} and no Unit({name}) in the Registry; name the file NAME.service (or \
             .socket, .timer, ...) and give that",
            shorten(arg),
            shorten(&looked.to_string_lossy())
        );
    }
    anyhow!("unable to find Unit({name}) in Registry or on filesystem")
}

fn check_requirements<C>(ctx: &mut Ctx<C>, name: &UnitName, file: &UnitFile) -> Result<()> {
    fleet_ops::decide::validate_file(name, file)?;
    for key in &Requirements::from_unit(name, file).unknown {
        ctx.warn(format!(
            "WARNING: Unit {name}: unrecognized requirement in [X-Fleet] section: {key:?}"
        ));
    }
    Ok(())
}

/// Writes every prepared action and returns the resulting units in argument order. New units
/// get `desired`, written together ([`Cluster::create_many`]: many per etcd transaction, or
/// many requests in flight over the API); replaced ones, together too
/// ([`Cluster::put_many_if`]), the higher of theirs and `desired`.
pub async fn apply<C: Cluster>(
    cluster: &C,
    prepared: Vec<Prepared>,
    desired: DesiredState,
    how: &ReplaceHow,
) -> Vec<(UnitName, Result<UnitStatus>)> {
    let mut results: Vec<Option<(UnitName, Result<UnitStatus>)>> = Vec::new();
    let mut creates = Vec::new();
    let mut created_at = Vec::new();
    let mut others = Vec::new();
    for (i, p) in prepared.into_iter().enumerate() {
        results.push(None);
        match p.action {
            Action::Create(file) => {
                created_at.push(i);
                creates.push(PutRequest {
                    name: p.name,
                    file: Some(file),
                    desired: Some(desired),
                    how: ReplaceHow::default(),
                });
            }
            action => others.push((i, p.name, action)),
        }
    }
    let created = cluster.create_many(creates).await;
    for (i, (name, res)) in created_at.into_iter().zip(created) {
        let res = res.map(outcome_status).map_err(Into::into);
        results[i] = Some((name, res));
    }
    // Replaced units together (over etcd, many per transaction), each written only over
    // what was read: another client's write since is not written over.
    let mut replaces = Vec::new();
    let mut replaced_at = Vec::new();
    for (i, name, action) in others {
        match action {
            Action::Keep(unit) => results[i] = Some((name, Ok(unit))),
            Action::Create(_) => unreachable!("creates were written above"),
            Action::Replace { existing, file } => {
                replaced_at.push(i);
                let req = PutRequest {
                    name,
                    file: Some(file),
                    desired: Some(existing.desired.max(desired)),
                    how: *how,
                };
                replaces.push((req, Expect::Content(existing.hash)));
            }
        }
    }
    let replaced = cluster.put_many_if(replaces).await;
    for (i, (name, res)) in replaced_at.into_iter().zip(replaced) {
        let res = res.map(outcome_status).map_err(Into::into);
        results[i] = Some((name, res));
    }
    results
        .into_iter()
        .map(|r| r.expect("every action has its result"))
        .collect()
}

fn outcome_status(outcome: PutOutcome) -> UnitStatus {
    match outcome {
        PutOutcome::Created(unit)
        | PutOutcome::Replaced(unit)
        | PutOutcome::StateChanged(unit)
        | PutOutcome::Unchanged(unit) => unit.status,
    }
}

/// `fleetctl submit [--replace] UNIT...`
pub async fn run<C: Cluster>(ctx: &mut Ctx<C>, args: &[String], replace: bool) -> Result<()> {
    let Resolved {
        prepared,
        differing,
        ..
    } = resolve(ctx, args, replace, Verb::Submit)
        .await
        .context("Error creating units")?;
    let announce: Vec<bool> = prepared
        .iter()
        .map(|p| !matches!(p.action, Action::Keep(_)))
        .collect();
    let results = apply(
        &ctx.cluster.clone(),
        prepared,
        DesiredState::Inactive,
        &ReplaceHow::default(),
    )
    .await;
    let mut failures = Vec::new();
    for ((name, res), announce) in results.into_iter().zip(announce) {
        match res {
            Ok(unit) if announce => ctx.say(format!("Unit {name} {}", unit.desired)),
            Ok(_) => {}
            Err(e) => failures.push((name, e)),
        }
    }
    super::fail_if_any(ctx, "Error creating", failures)?;
    not_submitted(&differing)
}

/// Issue 38: a submit that kept a unit as the registry has it, while the local file says
/// otherwise, did not do what it was asked (fleet exited 0 after its warning).
fn not_submitted(differing: &[UnitName]) -> Result<()> {
    match differing {
        [] => Ok(()),
        [one] => bail!(
            "Unit {one} was left as the registry has it, not as its local file says: \
             `submit --replace` replaces it"
        ),
        [first, .., last] => bail!(
            "{} units were left as the registry has them, not as their local files say \
             ({first} ... {last}): `submit --replace` replaces them",
            differing.len()
        ),
    }
}
