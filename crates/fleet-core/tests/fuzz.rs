//! Property-based fuzzing of the two parsers every untrusted byte goes through: unit names
//! (`UnitName`, `MachineId`, fleetctl's argument mangling) and unit files (`UnitFile::parse`,
//! then `[X-Fleet]` requirements). Promise 4 of `docs/guarantees.md`: bad input is refused with
//! a clear message, never a panic, and what is accepted is safe to use as a file name and an
//! etcd key segment, and reads back as itself.
//!
//! The case counts are bounded so the whole file runs in a few seconds in CI; set
//! `PROPTEST_CASES` to fuzz longer locally.

use fleet_core::{MachineId, Requirements, UnitFile, UnitName};
use proptest::prelude::*;
use std::path::{Component, Path};

/// Cases per property unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 1000;

fn config() -> ProptestConfig {
    config_scaled(1)
}

/// [`config`] with `1/divisor` of the cases, for the properties whose inputs are costly to
/// generate.
fn config_scaled(divisor: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES / divisor);
    ProptestConfig {
        cases,
        // Failures are reported with their input; a regression file per integration test
        // would be written next to this file, which is not wanted in CI.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A message fit for a terminal and a log line: not empty, one line, no control characters
/// (names and file text are quoted with their escapes), and of bounded size.
fn assert_clean_message(message: &str) {
    assert!(!message.trim().is_empty(), "empty error message");
    assert!(
        !message.chars().any(char::is_control),
        "control character in error message {message:?}"
    );
    assert!(
        message.len() <= 8 * 1024,
        "error message of {} bytes",
        message.len()
    );
}

/// What an accepted unit name must be: a single, plain, printable file name that stays in the
/// directory it is joined to, and an unambiguous etcd key segment.
fn assert_safe_name(name: &str) {
    assert!(!name.is_empty());
    assert!(name.len() <= fleet_core::name::MAX_NAME_LEN, "{name:?}");
    assert!(!name.contains('/'), "{name:?} contains '/'");
    assert!(
        !name.chars().any(|c| c.is_control() || c.is_whitespace()),
        "{name:?} contains a control or space character"
    );
    assert!(name.is_ascii(), "{name:?} is not ASCII");
    assert!(name != "." && name != "..", "{name:?}");
    let dir = Path::new("/run/fleet/units");
    let path = dir.join(name);
    assert_eq!(path.parent(), Some(dir), "{name:?} escapes the directory");
    let components: Vec<Component> = Path::new(name).components().collect();
    assert!(
        matches!(components.as_slice(), [Component::Normal(c)] if *c == name),
        "{name:?} is not one plain path component: {components:?}"
    );
}

/// Strings that look like unit names, near misses and tricks included.
fn name_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[a-zA-Z0-9]{1,12}",
        2 => Just("@".to_owned()),
        2 => Just(".".to_owned()),
        1 => Just("..".to_owned()),
        1 => Just("/".to_owned()),
        1 => Just("../".to_owned()),
        1 => Just("\\".to_owned()),
        1 => "[:_\\-]{1,3}",
        1 => "[\\x00-\\x1f\\x7f ]",
        1 => "\\PC",
        1 => Just("%n".to_owned()),
    ];
    let suffix = prop_oneof![
        4 => Just(".service".to_owned()),
        1 => Just(".socket".to_owned()),
        1 => Just(".timer".to_owned()),
        1 => Just(".target".to_owned()),
        1 => Just(".mount".to_owned()),
        1 => Just(".slice".to_owned()),
        1 => Just(String::new()),
        1 => "\\.[a-z]{0,9}",
    ];
    (prop::collection::vec(piece, 0..8), suffix).prop_map(|(pieces, suffix)| {
        let mut name = pieces.concat();
        name.push_str(&suffix);
        name
    })
}

/// Text shaped like a unit file: headers, assignments, comments, continuations, blank lines,
/// CRLF, odd whitespace and characters, sometimes broken.
fn unit_like() -> impl Strategy<Value = Vec<u8>> {
    let line = prop_oneof![
        3 => "\\[(Unit|Service|X-Fleet|Install|[A-Za-z ]{0,6})\\]",
        1 => "\\[[A-Za-z\\]\\[ ]{0,6}",
        6 => "[A-Za-z][A-Za-z0-9-]{0,8}",
        1 => "(MachineID|MachineOf|Conflicts|Replaces|Global|MachineMetadata|X-Conflicts|X-ConditionMachineOf|Bogus)",
        2 => " {0,2}= {0,2}",
        4 => "[^\\n\\r]{0,16}",
        1 => "[\\x00-\\x1f\\x7f\\u{85}\\u{a0}\\u{2028}]{1,3}",
        2 => Just("\\".to_owned()),
        1 => Just("\\ ".to_owned()),
        1 => "[#;][^\\n]{0,8}",
        1 => "(true|false|yes|\"a b\" c|%n|%i|%p|%N|\\*\\.service|region=us)",
    ];
    let physical = prop::collection::vec(line, 0..5).prop_map(|p| p.concat());
    (
        prop::collection::vec(physical, 0..24),
        prop::bool::ANY,
        prop::bool::ANY,
    )
        .prop_map(|(lines, crlf, final_eol)| {
            let eol = if crlf { "\r\n" } else { "\n" };
            let mut text = lines.join(eol);
            if final_eol {
                text.push_str(eol);
            }
            text.into_bytes()
        })
}

/// Every property of an accepted unit file: it reads back as itself (canonical text is a fixed
/// point, same hash), and its requirements parse and validate without panicking, with clean
/// messages.
fn check_unit_file(bytes: &[u8]) -> Result<(), TestCaseError> {
    let unit = match UnitFile::parse(bytes) {
        Ok(unit) => unit,
        Err(e) => {
            assert_clean_message(&e.to_string());
            return Ok(());
        }
    };
    let canonical = unit.canonical();
    let again = UnitFile::parse(canonical.as_bytes())
        .map_err(|e| TestCaseError::fail(format!("canonical text {canonical:?} refused: {e}")))?;
    prop_assert_eq!(again.canonical(), canonical.clone());
    prop_assert_eq!(again.hash(), unit.hash());
    prop_assert_eq!(again.options(), unit.options());
    let name: UnitName = "web@1.service".parse().expect("a valid name");
    let req = Requirements::from_unit(&name, &unit);
    if let Err(e) = req.validate() {
        assert_clean_message(&e.to_string());
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_string_is_a_safe_unit_name_or_a_clean_refusal(name in "\\PC{0,40}|.{0,300}") {
        match name.parse::<UnitName>() {
            Ok(parsed) => {
                assert_safe_name(parsed.as_str());
                prop_assert_eq!(parsed.as_str(), name.as_str());
            }
            Err(e) => assert_clean_message(&e.to_string()),
        }
    }

    #[test]
    fn name_like_strings_are_safe_names_or_clean_refusals(name in name_like()) {
        match name.parse::<UnitName>() {
            Ok(parsed) => {
                assert_safe_name(parsed.as_str());
                // Display is a fixed point of parsing.
                let again: UnitName = parsed.to_string().parse().expect("display reparses");
                prop_assert_eq!(&again, &parsed);
                // Derived names are names too.
                if let Some(template) = parsed.template() {
                    assert_safe_name(template.as_str());
                }
                prop_assert!(parsed.stem().len() < parsed.as_str().len());
            }
            Err(e) => assert_clean_message(&e.to_string()),
        }
    }

    #[test]
    fn any_string_is_a_safe_machine_id_or_a_clean_refusal(id in "\\PC{0,70}|[a-f0-9/._-]{0,70}") {
        match id.parse::<MachineId>() {
            Ok(parsed) => {
                assert_safe_name(parsed.as_str());
                prop_assert!(parsed.as_str().len() <= 64);
                prop_assert!(!parsed.as_str().contains('.'));
            }
            Err(e) => assert_clean_message(&e.to_string()),
        }
    }

    #[test]
    fn arbitrary_bytes_parse_to_a_fixed_point_or_a_clean_error(
        bytes in prop::collection::vec(any::<u8>(), 0..512)
    ) {
        check_unit_file(&bytes)?;
    }

}

proptest! {
    #![proptest_config(config_scaled(4))]

    #[test]
    fn unit_like_text_parses_to_a_fixed_point_or_a_clean_error(bytes in unit_like()) {
        check_unit_file(&bytes)?;
    }

    #[test]
    fn fleetctl_arguments_never_name_a_unit_outside_its_directory(arg in name_like()) {
        // An argument is a path; only its last component becomes the name.
        match UnitName::from_arg(&arg) {
            Ok(parsed) => {
                assert_safe_name(parsed.as_str());
                let last = arg.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
                prop_assert!(parsed.as_str().starts_with(last), "{arg:?} -> {parsed}");
            }
            Err(e) => assert_clean_message(&e.to_string()),
        }
    }
}

/// A file fleetctl accepts (at most `MAX_UNIT_FILE_BYTES` as written) must read back from the
/// registry, which stores and re-parses its canonical text. Canonical text can be longer than
/// what was written: it puts a blank line between sections and ends the last line with a
/// newline.
#[test]
fn a_file_accepted_at_the_size_limit_reads_back_from_its_canonical_text() {
    let max = fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
    let value = "v".repeat(400);
    let mut text = String::new();
    let mut i = 0;
    loop {
        let section = format!("[S{i}]\nA={value}\n");
        if text.len() + section.len() > max {
            break;
        }
        text.push_str(&section);
        i += 1;
    }
    // Either refused at the door (its canonical text would not fit), or it reads back.
    let unit = match UnitFile::parse(text.as_bytes()) {
        Ok(unit) => unit,
        Err(fleet_core::ParseError::TooLarge { size }) => {
            assert!(size > max, "refused as too large at {size} bytes");
            return;
        }
        Err(e) => panic!("unexpected refusal: {e}"),
    };
    let canonical = unit.canonical();
    let again = UnitFile::parse(canonical.as_bytes());
    assert!(
        again.is_ok(),
        "BUG: a {} byte unit file is accepted, but its {} byte canonical text (what the \
         registry stores and every reader parses) is refused: {}",
        text.len(),
        canonical.len(),
        again.unwrap_err()
    );
}

/// The canonical text (hence the hash, computed by fleetctl, the engine and every agent) of a
/// file within the size limit takes time linear in its size: 30,000 one-option sections
/// (about 370 KB) hash in well under two seconds even in a debug build.
#[test]
fn hashing_a_file_with_many_sections_takes_linear_time() {
    let mut text = String::new();
    for i in 0..30_000 {
        text.push_str(&format!("[S{i}]\nA=b\n"));
    }
    let unit = UnitFile::parse(text.as_bytes()).expect("within the limit");
    let (tx, rx) = std::sync::mpsc::channel();
    // A detached thread: if hashing hangs, the test fails after the budget instead of
    // keeping CI busy (the thread dies with the test process).
    std::thread::spawn(move || {
        let _ = tx.send(unit.hash());
    });
    let budget = std::time::Duration::from_secs(2);
    assert!(
        rx.recv_timeout(budget).is_ok(),
        "BUG: hashing a {} byte unit file of 30,000 sections took over {budget:?}: \
         UnitFile::canonical is quadratic in the number of sections",
        text.len()
    );
}

#[test]
fn path_tricks_in_fleetctl_arguments_keep_only_the_last_component() {
    for (arg, want) in [
        ("../x.service", Some("x.service")),
        ("../../etc/systemd/system/x.service", Some("x.service")),
        ("/etc/passwd", Some("passwd.service")),
        // `.` and `..` name no unit (fleet made them `..service` and `...service`).
        ("x/..", None),
        ("../", None),
        ("", None),
        (".", None),
        ("...service", Some("...service")),
        ("/", None),
        ("x/\u{7}/", None),
    ] {
        match (UnitName::from_arg(arg), want) {
            (Ok(name), Some(want)) => {
                assert_safe_name(name.as_str());
                assert_eq!(name.as_str(), want, "{arg:?}");
            }
            (Err(e), None) => assert_clean_message(&e.to_string()),
            (got, want) => panic!("{arg:?}: got {got:?}, want {want:?}"),
        }
    }
}
