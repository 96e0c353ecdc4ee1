use fleet_core::DesiredState;
use fleet_registry::UnitRecord;

use super::*;

fn file(exec: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\nExecStart={exec}\n").as_bytes()).unwrap()
}

/// A file of about `kib` KiB: one line of 1 KiB each (a unit file's line is at most 2 KiB).
fn big_file(tag: &str, kib: usize) -> UnitFile {
    let mut text = format!("[Service]\nExecStart=/bin/echo {tag}\n");
    for i in 0..kib {
        text.push_str(&format!("Environment=V{i}={}\n", "x".repeat(1000)));
    }
    UnitFile::parse(text.as_bytes()).unwrap()
}

fn names(l: &UnitListing) -> Vec<String> {
    l.units.iter().map(|u| u.name().to_string()).collect()
}

/// A snapshot at revision 9 of the units `named`, each with the file of its own `exec`.
fn snapshot(named: &[(&str, &UnitFile)]) -> Snapshot {
    let mut snap = Snapshot {
        revision: 9,
        ..Snapshot::default()
    };
    for (name, f) in named {
        let record = UnitRecord {
            name: name.parse().unwrap(),
            hash: f.hash(),
            desired: DesiredState::Inactive,
            restart: 0,
            replace: Default::default(),
        };
        let unit = Unit {
            record,
            mod_revision: 1,
        };
        snap.units.insert(name.parse().unwrap(), unit);
    }
    snap
}

#[test]
fn a_page_of_a_snapshot_starts_after_its_cursor_and_says_whether_more_follow() {
    let f = file("/bin/true");
    let snap = snapshot(&[("a.service", &f), ("b.service", &f), ("c.service", &f)]);
    let files = BTreeMap::from([(f.hash(), f)]);
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        None,
        PageLimit::units(2),
        Report::Page,
    );
    assert_eq!(names(&page), ["a.service", "b.service"]);
    let next = next.unwrap();
    assert_eq!((next.after.as_str(), next.revision), ("b.service", 9));
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        Some("b.service"),
        PageLimit::units(2),
        Report::Page,
    );
    assert_eq!(names(&page), ["c.service"]);
    assert_eq!(next, None);
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        Some("bb"),
        PageLimit::units(1),
        Report::Page,
    );
    assert_eq!(names(&page), ["c.service"]);
    assert_eq!(next, None, "nothing after the last");
}

#[test]
fn a_page_ends_where_its_files_pass_the_bytes_and_its_cursor_says_so() {
    let (small, big) = (file("/bin/true"), big_file("b", 1));
    let snap = snapshot(&[
        ("a.service", &small),
        ("b.service", &big),
        ("c.service", &small),
    ]);
    let files = BTreeMap::from([(small.hash(), small.clone()), (big.hash(), big.clone())]);
    let limit = PageLimit {
        units: 100,
        bytes: small.api_form_len() + big.api_form_len(),
    };
    let (page, next) = page_of(&snap, &files, std::iter::empty(), None, limit, Report::Page);
    assert_eq!(
        names(&page),
        ["a.service", "b.service"],
        "c passes the bytes"
    );
    let next = next.expect("more follow");
    assert_eq!((next.after.as_str(), next.revision), ("b.service", 9));
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        Some(&next.after),
        limit,
        Report::Page,
    );
    assert_eq!(names(&page), ["c.service"]);
    assert_eq!(next, None);
}

#[test]
fn a_unit_larger_than_the_bytes_still_makes_a_page_of_one() {
    let big = big_file("a", 1);
    let snap = snapshot(&[("a.service", &big), ("b.service", &big)]);
    let files = BTreeMap::from([(big.hash(), big.clone())]);
    let limit = PageLimit {
        units: 100,
        bytes: 10,
    };
    let (page, next) = page_of(&snap, &files, std::iter::empty(), None, limit, Report::Page);
    assert_eq!(names(&page), ["a.service"]);
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        Some(&next.unwrap().after),
        limit,
        Report::Page,
    );
    assert_eq!((names(&page), next), (vec!["b.service".to_owned()], None));
}

#[test]
fn the_whole_listing_is_one_page_however_large_its_files() {
    let big = big_file("w", 4);
    let named: Vec<String> = (0..3_000).map(|i| format!("u{i:04}.service")).collect();
    let snap = snapshot(&named.iter().map(|n| (n.as_str(), &big)).collect::<Vec<_>>());
    assert!(
        3_000 * big.api_form_len() > PAGE_BYTES,
        "more than a page's bytes"
    );
    let files = BTreeMap::from([(big.hash(), big.clone())]);
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        None,
        PageLimit::WHOLE,
        Report::Whole,
    );
    assert_eq!((page.units.len(), next), (3_000, None));
    let (page, next) = page_of(
        &snap,
        &files,
        std::iter::empty(),
        None,
        PageLimit::units(65_535),
        Report::Page,
    );
    assert!(
        page.units.len() < 3_000 && next.is_some(),
        "{} units",
        page.units.len()
    );
}
