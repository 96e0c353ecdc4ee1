//! fleet v1.0's hash of odd unit files, live (issue 40, item 3): every file of
//! `crates/fleet-core/tests/fleet_hashes/` is submitted with fleet's own fleetctl
//! (`../shared/reference-fleet/`) to an etcd serving its v2 API, and with ours to the same
//! etcd's v3 keyspace; each side's `list-unit-files` must show the same hash, or both refuse
//! the file, and fleet must still say what `expected.txt` recorded (the values fleet-core's
//! unit test checks without etcd cannot drift from the real thing). Fails when fleet's
//! binaries are missing. Needs no root: one etcd, no machines.

use anyhow::{Context, Result, ensure};
use fleet_functional_tests::{OutputExt, default_bin_dir, reference_fleetctl, workspace_dir};
use fleet_testing::TestEtcd;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a side made of a file: its hash, or `None` where it refused it.
type Verdicts = BTreeMap<String, Option<String>>;

fn corpus() -> PathBuf {
    workspace_dir().join("crates/fleet-core/tests/fleet_hashes")
}

fn corpus_files() -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus())?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|p| p.extension().is_some_and(|e| e == "service"));
    files.sort();
    ensure!(!files.is_empty(), "no unit files in {}", corpus().display());
    Ok(files)
}

/// `expected.txt`: the verdicts recorded from fleet.
fn recorded() -> Result<Verdicts> {
    let text = std::fs::read_to_string(corpus().join("expected.txt"))?;
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, verdict) = l.split_once(' ').context("a line without a verdict")?;
            Ok((
                name.to_owned(),
                (verdict != "refused").then(|| verdict.to_owned()),
            ))
        })
        .collect()
}

/// Submits every file with `fleetctl` (each on its own: one refusal stops a whole submit),
/// then reads the hashes back from its listing.
fn verdicts(fleetctl: &Path, endpoint: &str, files: &[PathBuf]) -> Result<Verdicts> {
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new(fleetctl)
            .arg("--driver=etcd")
            .arg(format!("--endpoint={endpoint}"))
            .args(args)
            .output()
            .with_context(|| format!("cannot run {}", fleetctl.display()))
    };
    let mut submitted = Vec::new();
    for file in files {
        let out = run(&["submit".as_ref(), file.as_os_str()])?;
        let name = file.file_name().context("a file name")?;
        submitted.push((name.to_string_lossy().into_owned(), out.status.success()));
    }
    let listing = run(&[
        "list-unit-files".as_ref(),
        "--full".as_ref(),
        "--no-legend".as_ref(),
        "--fields=unit,hash".as_ref(),
    ])?;
    ensure!(
        listing.status.success(),
        "{} list-unit-files failed: {}",
        fleetctl.display(),
        String::from_utf8_lossy(&listing.stderr)
    );
    let hashes: BTreeMap<String, String> = listing
        .stdout_text()
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect();
    submitted
        .into_iter()
        .map(|(name, ok)| {
            let hash = hashes.get(&name).cloned();
            ensure!(
                ok == hash.is_some(),
                "{} submitted {name}: {ok}, but lists it with hash {hash:?}",
                fleetctl.display()
            );
            Ok((name, hash))
        })
        .collect()
}

/// Where the two disagree, one line per file.
fn differences(label: &str, want: &Verdicts, got: &Verdicts) -> Vec<String> {
    want.iter()
        .filter(|(name, w)| got.get(*name) != Some(w))
        .map(|(name, w)| format!("{name}: fleet {w:?}, {label} {:?}", got.get(name)))
        .collect()
}

#[test]
fn ours_hashes_and_refuses_every_odd_unit_file_as_fleet_does() -> Result<()> {
    let fleet = reference_fleetctl()?;
    let ours = default_bin_dir().join("fleetctl");
    ensure!(
        ours.is_file(),
        "no {} (cargo build --workspace --bins)",
        ours.display()
    );
    let files = corpus_files()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // fleet v1.0 speaks only etcd's v2 API, which etcd 3.4 serves beside v3 when asked.
    let etcd = runtime.block_on(TestEtcd::start_with_args(&["--enable-v2".to_owned()]));
    let theirs = verdicts(&fleet, &etcd.endpoint(), &files)?;
    let mine = verdicts(&ours, &etcd.endpoint(), &files)?;
    let mut wrong = differences("recorded", &theirs, &recorded()?);
    wrong.extend(differences("ours", &theirs, &mine));
    ensure!(
        wrong.is_empty(),
        "{} of {} files differ:\n{}",
        wrong.len(),
        files.len(),
        wrong.join("\n")
    );
    Ok(())
}
