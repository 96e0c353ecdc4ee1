//! Every unit file in `tests/fleet_hashes/` against what fleet v1.0 made of it, as recorded in
//! `tests/fleet_hashes/expected.txt` (how it was recorded is written at its top): the same hash
//! where fleet accepted the file, a refusal where fleet refused it.
//! `functional-tests/tests/fleet_hash.rs` checks the same files against fleet's binaries live.

use fleet_core::UnitFile;
use std::path::PathBuf;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fleet_hashes")
}

/// `(file name, Some(hash) or None where fleet refused)`, in the file's order.
fn expected() -> Vec<(String, Option<String>)> {
    let text = std::fs::read_to_string(corpus().join("expected.txt")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, verdict) = l.split_once(' ').unwrap();
            let hash = (verdict != "refused").then(|| verdict.to_owned());
            (name.to_owned(), hash)
        })
        .collect()
}

#[test]
fn every_corpus_file_has_a_recorded_verdict() {
    let recorded: Vec<String> = expected().into_iter().map(|(n, _)| n).collect();
    let mut files: Vec<String> = std::fs::read_dir(corpus())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".service"))
        .collect();
    files.sort();
    let mut sorted = recorded.clone();
    sorted.sort();
    assert_eq!(files, sorted);
}

#[test]
fn hashes_and_refuses_each_file_as_fleet_did() {
    let mut wrong = Vec::new();
    for (name, want) in expected() {
        let bytes = std::fs::read(corpus().join(&name)).unwrap();
        let got = UnitFile::parse(&bytes).map(|f| f.hash().to_string());
        match (&want, &got) {
            (Some(w), Ok(g)) if w == g => {}
            (None, Err(_)) => {}
            _ => wrong.push(format!("{name}: fleet {want:?}, ours {got:?}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
