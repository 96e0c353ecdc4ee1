//! Unit files carried in schedule entries (issue 43).
//!
//! An agent needs the file of every unit scheduled on its machine, and reads each from
//! `P/file/<hash>` when the entry arrives: in the 100,000-unit launch on 5,000 machines
//! those reads were 100,000 of etcd's 207,000 transactions, each paying etcd 3.4's per-`Txn`
//! read view and its garbage (docs/benchmarks.md, *etcd's profile in the launch*). With
//! fleetd's `trust_engine_files`, the engine writes a small file's canonical text into the
//! entry's value, next to the entry's fields, and the agent takes it from there when it
//! hashes to the entry's `hash`. A larger file, an entry written by anything but the engine,
//! or a text that does not hash to the entry, is read from `P/file/<hash>` as before. Every
//! other reader of an entry ignores the text, which [`ScheduleEntry`] does not hold: a
//! carried text never makes two entries differ.
//!
//! The check that the text hashes to the entry proves nothing against an engine host, which
//! writes both: taking the text is trusting engine hosts with files no operator stored, which
//! without it they cannot write (docs/security.md). So it is a setting, off by default.

use fleet_core::{UnitFile, UnitHash};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use crate::kv::KeyValue;
use crate::read::keyed_file;
use crate::records::ScheduleEntry;

/// The most bytes of canonical text an entry carries. Typical unit files are a few hundred
/// bytes. The bound keeps the engine's schedule transactions small (at most 64 entries a
/// transaction: 64 × 2 KiB, even with every byte escaped six-fold, is within
/// [`MAX_TXN_BYTES`](crate::kv::MAX_TXN_BYTES)), and a global unit's text, copied into every
/// machine's entry, at 10 MiB on 5,000 machines.
pub const MAX_CARRIED_TEXT: usize = 2048;

/// The canonical texts the engine's schedule entries carry, by the hash they hash to.
pub type CarriedTexts = HashMap<UnitHash, String>;

/// The texts to carry for the files of `hashes` found in `files`: those of at most
/// [`MAX_CARRIED_TEXT`] bytes.
pub fn texts_of<'a>(
    hashes: impl IntoIterator<Item = &'a UnitHash>,
    files: &BTreeMap<UnitHash, UnitFile>,
) -> CarriedTexts {
    let mut texts = CarriedTexts::new();
    for hash in hashes {
        if texts.contains_key(hash) {
            continue;
        }
        if let Some(text) = files.get(hash).map(UnitFile::canonical)
            && text.len() <= MAX_CARRIED_TEXT
        {
            texts.insert(*hash, text);
        }
    }
    texts
}

/// An entry's value as the engine writes it: the entry's fields and, when known, the text of
/// its file.
#[derive(Serialize)]
struct Written<'a> {
    #[serde(flatten)]
    entry: &'a ScheduleEntry,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

/// The value of `entry` carrying `text` (if any).
pub(crate) fn encode_entry(entry: &ScheduleEntry, text: Option<&str>) -> Vec<u8> {
    serde_json::to_vec(&Written { entry, text }).expect("a schedule entry serializes")
}

/// The file an entry's value carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CarriedFile {
    /// No text: the file is read from `P/file/<hash>`.
    Absent,
    /// A text that reads as the file of the entry's hash.
    File(UnitFile),
    /// A text that does not: why. The file is read from `P/file/<hash>`.
    Unreadable(String),
}

/// What the value of `kv`, read as `entry`, carries.
pub(crate) fn carried_file(entry: &ScheduleEntry, kv: &KeyValue) -> CarriedFile {
    #[derive(Deserialize)]
    struct Text<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
    }
    match serde_json::from_slice::<Text>(&kv.value) {
        Ok(Text { text: None }) => CarriedFile::Absent,
        Ok(Text { text: Some(text) }) => match keyed_file(&entry.hash, text.as_bytes()) {
            Ok(file) => CarriedFile::File(file),
            Err(why) => CarriedFile::Unreadable(why),
        },
        Err(e) => CarriedFile::Unreadable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_core::DesiredState;

    fn file(exec: &str) -> UnitFile {
        UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
    }

    fn entry(f: &UnitFile) -> ScheduleEntry {
        ScheduleEntry {
            name: "a.service".parse().unwrap(),
            machine: "m1".parse().unwrap(),
            hash: f.hash(),
            desired: DesiredState::Launched,
            restart: 0,
            no_restart: false,
            placement: 0,
        }
    }

    fn kv(value: Vec<u8>) -> KeyValue {
        crate::read::tests::kv("/t/schedule/m1/a.service", value)
    }

    #[test]
    fn an_entry_carrying_its_text_reads_as_the_same_entry_and_its_file() {
        let f = file("/bin/a");
        let e = entry(&f);
        let value = encode_entry(&e, Some(&f.canonical()));
        let read: ScheduleEntry = serde_json::from_slice(&value).unwrap();
        assert_eq!(read, e, "readers that ignore the text see the entry");
        assert_eq!(carried_file(&e, &kv(value)), CarriedFile::File(f));
    }

    #[test]
    fn an_entry_without_text_is_written_as_before() {
        let e = entry(&file("/bin/a"));
        let value = encode_entry(&e, None);
        assert_eq!(value, serde_json::to_vec(&e).unwrap());
        assert_eq!(carried_file(&e, &kv(value)), CarriedFile::Absent);
    }

    #[test]
    fn a_text_of_another_file_is_not_taken() {
        let (f, other) = (file("/bin/a"), file("/bin/b"));
        let e = entry(&f);
        let value = encode_entry(&e, Some(&other.canonical()));
        let CarriedFile::Unreadable(why) = carried_file(&e, &kv(value)) else {
            panic!("another file's text was taken");
        };
        assert!(why.contains("hashes to"), "{why}");
    }

    #[test]
    fn only_small_known_files_are_carried() {
        let small = file("/bin/a");
        let long = format!(
            "[Service]\n{}",
            "Environment=X=1\n".repeat(MAX_CARRIED_TEXT / 16)
        );
        let big = UnitFile::parse(long.as_bytes()).unwrap();
        assert!(big.canonical().len() > MAX_CARRIED_TEXT);
        let unknown = file("/bin/unknown");
        let files: BTreeMap<UnitHash, UnitFile> = [&small, &big]
            .into_iter()
            .map(|f| (f.hash(), f.clone()))
            .collect();
        let hashes = [small.hash(), big.hash(), unknown.hash(), small.hash()];
        let texts = texts_of(&hashes, &files);
        assert_eq!(texts.len(), 1);
        assert_eq!(texts[&small.hash()], small.canonical());
    }
}
