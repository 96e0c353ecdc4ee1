//! Keeps `make deps` honest on machines that already have everything installed.
//!
//! A fresh Debian gets only what the Makefile's `APT_PACKAGES` names (installed without
//! recommends) plus the packages every Debian has (`Priority: required`). So every file the
//! build and the tests use must come from one of those. `scripts/deps.tsv` lists each such file
//! with its package; these tests check with `dpkg -S` that the file really comes from that
//! package, that the package is one a fresh machine gets, and that every program the code runs
//! by name is listed. A package missing from the list (as libprotobuf-dev once was) then fails
//! here on any machine, also on one where it happens to be installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// One line of `scripts/deps.tsv`.
#[derive(Debug)]
struct Dep {
    path: String,
    package: String,
}

fn deps() -> Vec<Dep> {
    let text = std::fs::read_to_string(workspace().join("scripts/deps.tsv")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut cols = l.split('\t');
            let (Some(path), Some(package), Some(_why)) = (cols.next(), cols.next(), cols.next())
            else {
                panic!("scripts/deps.tsv: not `path<TAB>package<TAB>why`: {l:?}");
            };
            Dep {
                path: path.to_owned(),
                package: package.to_owned(),
            }
        })
        .collect()
}

/// The Makefile's `APT_PACKAGES := ...` (one line, as scripts and hooks read it).
fn apt_packages() -> BTreeSet<String> {
    let makefile = std::fs::read_to_string(workspace().join("Makefile")).unwrap();
    let line = makefile
        .lines()
        .find_map(|l| l.strip_prefix("APT_PACKAGES :="))
        .expect("the Makefile has an `APT_PACKAGES := ...` line");
    line.split_whitespace().map(str::to_owned).collect()
}

/// The packages that ship each path, by one `dpkg -S` (a call reads dpkg's whole database). On
/// a merged-/usr system dpkg knows a file by the path its package ships (`/bin/ip`,
/// `/usr/bin/nsenter`), so both spellings are asked.
fn owners(paths: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let spellings = |path: &str| {
        let alias = match path.strip_prefix("/usr") {
            Some(rest) => rest.to_owned(),
            None => format!("/usr{path}"),
        };
        [path.to_owned(), alias]
    };
    let asked: Vec<String> = paths.iter().flat_map(|p| spellings(p)).collect();
    // Exits 1 when some spelling is unknown, which the alias of every known path is.
    let out = Command::new("dpkg")
        .arg("-S")
        .args(&asked)
        .output()
        .expect("dpkg runs (this project builds on Debian)");
    let mut by_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "pkg[:arch][, pkg2]: /path"; "diversion by dash from: /bin/sh" lines name no owner.
        let Some((owners, file)) = line.rsplit_once(": ") else {
            continue;
        };
        if owners.starts_with("diversion by") {
            continue;
        }
        let entry = by_file.entry(file.to_owned()).or_default();
        for owner in owners.split(", ") {
            entry.insert(owner.split(':').next().unwrap_or(owner).to_owned());
        }
    }
    paths
        .iter()
        .map(|p| {
            let found = spellings(p)
                .iter()
                .filter_map(|s| by_file.get(s))
                .flatten()
                .cloned()
                .collect();
            ((*p).to_owned(), found)
        })
        .collect()
}

fn priority(package: &str) -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Priority}", package])
        .output()
        .expect("dpkg-query runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn every_file_the_build_and_tests_use_comes_from_a_package_a_fresh_machine_gets() {
    let listed = apt_packages();
    let deps = deps();
    let paths: Vec<&str> = deps.iter().map(|d| d.path.as_str()).collect();
    let owners_of = owners(&paths);
    let mut problems = Vec::new();
    for dep in &deps {
        let owners = &owners_of[&dep.path];
        if owners.is_empty() {
            problems.push(format!(
                "{}: no installed package ships it (run `make deps`; is {} right?)",
                dep.path, dep.package
            ));
            continue;
        }
        if !owners.contains(&dep.package) {
            problems.push(format!(
                "{}: scripts/deps.tsv says {}, dpkg says {owners:?}",
                dep.path, dep.package
            ));
            continue;
        }
        if !listed.contains(&dep.package) && priority(&dep.package) != "required" {
            problems.push(format!(
                "{}: its package {} is neither in the Makefile's APT_PACKAGES nor \
                 Priority: required (it is {:?}), so a fresh machine lacks it",
                dep.path,
                dep.package,
                priority(&dep.package)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_listed_apt_package_is_needed_by_a_listed_file() {
    let needed: BTreeSet<String> = deps().into_iter().map(|d| d.package).collect();
    let unused: Vec<String> = apt_packages().difference(&needed).cloned().collect();
    assert!(
        unused.is_empty(),
        "APT_PACKAGES names packages no line of scripts/deps.tsv needs: {unused:?}"
    );
}

/// Program names the code starts by name: `Command::new("x")`, `cmd::run("x", ..)`, and a
/// machine's `exec("x", ..)`. (Shell scripts and `sh` lines are listed by hand.)
fn programs_in(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ["Command::new(\"", "cmd::run(\"", ".exec(\""] {
        let mut rest = source;
        while let Some(at) = rest.find(call) {
            rest = &rest[at + call.len()..];
            if let Some(end) = rest.find('"') {
                found.push(rest[..end].to_owned());
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_program_the_code_runs_by_name_is_listed() {
    let listed: BTreeSet<String> = deps()
        .iter()
        .filter_map(|d| d.path.rsplit('/').next().map(str::to_owned))
        .collect();
    let mut files = Vec::new();
    rust_files(&workspace().join("crates"), &mut files);
    rust_files(&workspace().join("functional-tests"), &mut files);
    let mut unlisted = BTreeSet::new();
    // This file names programs in its own test of `programs_in`.
    files.retain(|f| !f.ends_with("tests/packages.rs"));
    for file in files {
        let source = std::fs::read_to_string(&file).unwrap();
        for program in programs_in(&source) {
            let name = program.rsplit('/').next().unwrap_or(&program).to_owned();
            if !listed.contains(&name) {
                unlisted.insert(format!("{name} ({})", file.display()));
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "programs run by name but missing from scripts/deps.tsv: {unlisted:?}"
    );
}

#[test]
fn finds_programs_in_each_way_the_code_starts_them() {
    let source = r#"Command::new("a"); cmd::run("b", ["x"]); m.exec("c", [])"#;
    assert_eq!(programs_in(source), ["a", "b", "c"]);
}
