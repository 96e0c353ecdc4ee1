use super::*;
use proptest::prelude::*;

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

/// Requirements of `unit` whose `[X-Fleet]` section holds `lines`.
fn reqs_of(unit: &str, lines: &str) -> Requirements {
    let text = format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{lines}\n");
    Requirements::from_unit(&name(unit), &UnitFile::parse(text.as_bytes()).unwrap())
}

fn reqs(lines: &str) -> Requirements {
    reqs_of("web@1.service", lines)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn metadata(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), strings(v)))
        .collect()
}

#[test]
fn a_unit_without_x_fleet_has_no_requirements() {
    let file =
        UnitFile::parse(b"[Service]\nExecStart=/bin/true\n[Other]\nMachineID=abc\n").unwrap();
    assert_eq!(
        Requirements::from_unit(&name("a.service"), &file),
        Requirements::default()
    );
    assert_eq!(Requirements::default().validate(), Ok(()));
}

#[test]
fn takes_the_machine_id_from_the_first_present_key() {
    let table: &[(&str, Option<&str>)] = &[
        ("MachineID=a\nMachineID=b", Some("a")),
        (
            "X-ConditionMachineBootID=c\nX-ConditionMachineID=b\nMachineID=a",
            Some("a"),
        ),
        (
            "X-ConditionMachineBootID=c\nX-ConditionMachineID=b",
            Some("b"),
        ),
        ("X-ConditionMachineBootID=c", Some("c")),
        ("MachineID=\"x\" \"y\"", Some("x")),
        ("MachineID=", Some("")),
        ("MachineOf=a.service", None),
    ];
    for (lines, want) in table {
        assert_eq!(reqs(lines).machine_id.as_deref(), *want, "{lines:?}");
    }
}

#[test]
fn splits_quoted_multi_values() {
    let table: &[(&str, &[&str])] = &[
        (
            "MachineOf=\"a.service\" \"b.service\"",
            &["a.service", "b.service"],
        ),
        (
            "MachineOf=\"a.service b.service\"",
            &["a.service b.service"],
        ),
        ("MachineOf=\"a\"\"b\"", &["ab"]),
        ("MachineOf=\"a\"  \"b\"", &["a", "", "b"]),
        ("MachineOf=\"a\" b \"c\"", &["a", "b", "c"]),
        ("MachineOf=\"a\tb\"", &["a\tb"]),
        ("MachineOf=\"", &[""]),
        // Unless it both starts and ends with a quote, a value is one value.
        ("MachineOf=a.service b.service", &["a.service b.service"]),
        (
            "MachineOf=\"a.service\" b.service",
            &["\"a.service\" b.service"],
        ),
        (
            "MachineOf=a.service \"b.service\"",
            &["a.service \"b.service\""],
        ),
    ];
    for (lines, want) in table {
        assert_eq!(reqs(lines).machine_of, strings(want), "{lines:?}");
    }
}

#[test]
fn accumulates_repeated_lines_deprecated_spelling_first() {
    let r = reqs(
        "MachineOf=b.service\nX-ConditionMachineOf=a.service\nMachineOf=c.service\nX-Conflicts=x.*\nConflicts=y.*\nX-Conflicts=z.*\nReplaces=r1.service\nReplaces=\"r2.service\" \"r3.service\"",
    );
    assert_eq!(
        r.machine_of,
        strings(&["a.service", "b.service", "c.service"])
    );
    assert_eq!(r.conflicts, strings(&["x.*", "z.*", "y.*"]));
    assert_eq!(
        r.replaces,
        strings(&["r1.service", "r2.service", "r3.service"])
    );
}

#[test]
fn splits_conflicts_on_whitespace_but_not_peers_or_replaces() {
    let r = reqs(
        "Conflicts=a.service  b.service\tc*\nConflicts=\nMachineOf=p.service q.service\nReplaces=r.service s.service",
    );
    assert_eq!(r.conflicts, strings(&["a.service", "b.service", "c*"]));
    assert_eq!(r.machine_of, strings(&["p.service q.service"]));
    assert_eq!(r.replaces, strings(&["r.service s.service"]));
}

#[test]
fn reads_metadata_pairs_and_ignores_malformed_ones() {
    let r = reqs(
        "MachineMetadata=region=us\nMachineMetadata=\"region=eu\" \"disk=ssd\"\nX-ConditionMachineMetadata=region=asia\nMachineMetadata=region=us\nMachineMetadata=a=b=c\nMachineMetadata==x\nMachineMetadata=y=\nMachineMetadata=novalue\nMachineMetadata=",
    );
    assert_eq!(
        r.metadata,
        metadata(&[("disk", &["ssd"]), ("region", &["asia", "us", "eu"])])
    );
}

#[test]
fn decides_global_by_the_last_value() {
    let table: &[(&str, bool)] = &[
        ("Global=true", true),
        ("Global=TRUE", true),
        ("Global=Yes", true),
        ("Global=1", true),
        ("Global=on", true),
        ("Global=t", true),
        ("Global=T", true),
        ("Global=false", false),
        ("Global=y", false),
        ("Global=enabled", false),
        ("Global=", false),
        ("Global=true\nGlobal=false", false),
        ("Global=false\nGlobal=true", true),
        ("Global=\"true\" \"no\"", false),
        ("Global=\"no\" \"on\"", true),
        ("MachineOf=a.service", false),
    ];
    for (lines, want) in table {
        assert_eq!(reqs(lines).global, *want, "{lines:?}");
        assert_eq!(global_alone("web@1.service", lines), *want, "{lines:?}");
    }
}

fn global_alone(unit: &str, lines: &str) -> bool {
    let text = format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{lines}\n");
    Requirements::global(&name(unit), &UnitFile::parse(text.as_bytes()).unwrap())
}

#[test]
fn global_alone_substitutes_specifiers_as_the_whole_read_does() {
    for (unit, lines) in [
        ("web@true.service", "Global=%i"),
        ("web@no.service", "Global=%i"),
        ("web@1.service", "Global=\"%i\" \"%p\""),
        ("on@x.service", "Global=\"false\" \"%p\""),
        ("web@1.service", "Global=true\n[Service]\nGlobal=false"),
    ] {
        assert_eq!(
            global_alone(unit, lines),
            reqs_of(unit, lines).global,
            "{unit} {lines:?}"
        );
    }
}

#[test]
fn substitutes_specifiers_in_every_value() {
    let r = reqs_of(
        "web@blue.service",
        "MachineID=%i-host\nMachineOf=%p-db@%i.service\nConflicts=%p@*.service %N.socket\nReplaces=%n\nMachineMetadata=color=%i\nGlobal=%i",
    );
    assert_eq!(r.machine_id.as_deref(), Some("blue-host"));
    assert_eq!(r.machine_of, strings(&["web-db@blue.service"]));
    assert_eq!(r.conflicts, strings(&["web@*.service", "web@blue.socket"]));
    assert_eq!(r.replaces, strings(&["web@blue.service"]));
    assert_eq!(r.metadata, metadata(&[("color", &["blue"])]));
    assert!(!r.global);
}

#[test]
fn substitutes_specifiers_as_plain_replacements() {
    let table: &[(&str, &str, &str)] = &[
        (
            "plain.service",
            "%n|%N|%p|%i|",
            "plain.service|plain|plain||",
        ),
        ("tpl@.service", "%n|%N|%p|%i|", "tpl@.service|tpl@|tpl||"),
        (
            "a.b@c.d.timer",
            "%n|%N|%p|%i",
            "a.b@c.d.timer|a.b@c.d|a.b|c.d",
        ),
        ("x@1.service", "%%n %x %I %%", "%x@1.service %x %I %%"),
    ];
    for (unit, value, want) in table {
        let r = reqs_of(unit, &format!("MachineOf={value}"));
        assert_eq!(r.machine_of, strings(&[want]), "{unit} {value:?}");
    }
}

#[test]
fn collects_unknown_keys_once_in_file_order() {
    let r = reqs(
        "Foo=1\nMachineOf=a.service\nmachineid=lowercase\nFoo=2\nX-ConditionMachineOf=b.service\nBar=",
    );
    assert_eq!(r.unknown, strings(&["Foo", "machineid", "Bar"]));
    assert_eq!(r.machine_id, None);
    for key in KNOWN_KEYS {
        assert!(reqs(&format!("{key}=x")).unknown.is_empty(), "{key}");
    }
}

#[test]
fn validates_with_fleets_messages_in_fleets_order() {
    let table: &[(&str, Option<&str>)] = &[
        ("MachineID=abc", None),
        ("MachineID=abc\nMachineMetadata=a=b", None),
        (
            "MachineID=abc\nMachineOf=a.service",
            Some("MachineID cannot be used with MachineOf"),
        ),
        (
            "MachineID=abc\nConflicts=a.service",
            Some("MachineID cannot be used with Conflicts"),
        ),
        (
            "MachineID=abc\nGlobal=true",
            Some("MachineID cannot be used with Global"),
        ),
        ("MachineID=abc\nGlobal=false", None),
        (
            "MachineID=abc\nReplaces=a.service",
            Some("MachineID cannot be used with Replaces"),
        ),
        (
            "X-ConditionMachineBootID=abc\nMachineOf=a.service\nConflicts=b.service\nGlobal=true\nReplaces=c.service",
            Some("MachineID cannot be used with MachineOf"),
        ),
        (
            "MachineID=abc\nConflicts=b.service\nGlobal=true\nReplaces=c.service",
            Some("MachineID cannot be used with Conflicts"),
        ),
        (
            "MachineID=abc\nGlobal=on\nReplaces=c.service",
            Some("MachineID cannot be used with Global"),
        ),
        (
            "MachineID=\nMachineOf=a.service",
            Some("MachineID cannot be used with MachineOf"),
        ),
        ("MachineID=abc\nConflicts=", None),
        (
            "Global=true\nMachineOf=a.service",
            Some("Global cannot be used with MachineOf"),
        ),
        (
            "Global=true\nMachineOf=a.service\nReplaces=b.service",
            Some("Global cannot be used with MachineOf"),
        ),
        (
            "Global=true\nReplaces=a.service",
            Some("Global cannot be used with Replaces"),
        ),
        (
            "Global=true\nConflicts=a.service\nMachineMetadata=a=b",
            None,
        ),
        (
            "Conflicts=a.service\nReplaces=b.service",
            Some("Conflicts cannot be used with Replaces"),
        ),
        ("MachineOf=a.service\nConflicts=b.service", None),
        ("MachineOf=a.service\nReplaces=b.service", None),
        (
            "MachineOf=a.service\nConflicts=a.service",
            Some(r#"unresolvable requirements: peer "a.service" matches conflict "a.service""#),
        ),
        (
            "MachineOf=b.service\nMachineOf=db@1.service\nConflicts=x.service db@*",
            Some(r#"unresolvable requirements: peer "db@1.service" matches conflict "db@*""#),
        ),
        (
            "MachineOf=a.service\nReplaces=*.service",
            Some(r#"unresolvable requirements: peer "a.service" matches replace "*.service""#),
        ),
        // The peer check comes first, even before MachineID's.
        (
            "MachineID=abc\nMachineOf=a.service\nConflicts=a.*",
            Some(r#"unresolvable requirements: peer "a.service" matches conflict "a.*""#),
        ),
        // Conflicts are looked at before Replaces for each peer.
        (
            "MachineOf=a.service\nReplaces=a.service\nConflicts=a.service",
            Some(r#"unresolvable requirements: peer "a.service" matches conflict "a.service""#),
        ),
        // Specifiers are substituted before validating.
        (
            "MachineOf=%p-db.service\nConflicts=web-*",
            Some(r#"unresolvable requirements: peer "web-db.service" matches conflict "web-*""#),
        ),
        ("MachineOf=a.service\nConflicts=[", None),
    ];
    for (lines, want) in table {
        let got = reqs(lines).validate().err().map(|e| e.to_string());
        assert_eq!(got.as_deref(), *want, "{lines:?}");
    }
}

#[test]
fn quotes_unusual_names_in_messages_like_go() {
    let e = RequirementError::PeerMatchesConflict {
        peer: "a\tb".into(),
        conflict: "a\"*".into(),
    };
    assert_eq!(
        e.to_string(),
        r#"unresolvable requirements: peer "a\tb" matches conflict "a\"*""#
    );
}

#[test]
fn matches_conflicts_and_replaces_by_glob() {
    let r = reqs("Conflicts=web@*.service db.service\nReplaces=old-[0-9].service");
    assert!(r.conflicts_with(&name("web@2.service")));
    assert!(r.conflicts_with(&name("db.service")));
    assert!(!r.conflicts_with(&name("db.socket")));
    assert!(r.replaces_name(&name("old-3.service")));
    assert!(!r.replaces_name(&name("old-10.service")));
    assert!(!Requirements::default().conflicts_with(&name("a.service")));
}

#[test]
fn treats_a_conflict_declared_on_either_side_as_mutual() {
    let a = name("a.service");
    let b = name("b.service");
    let c = name("c.service");
    let none = Requirements::default();
    let hates_b = reqs_of("a.service", "Conflicts=b.*");
    let hates_all = reqs_of("a.service", "Conflicts=*");
    assert!(units_conflict((&a, &hates_b), (&b, &none)));
    assert!(units_conflict((&b, &none), (&a, &hates_b)));
    assert!(!units_conflict((&a, &hates_b), (&c, &none)));
    assert!(!units_conflict((&a, &none), (&b, &none)));
    // A unit matching its own glob does not conflict with itself.
    assert!(!units_conflict((&a, &hates_all), (&a, &hates_all)));
}

#[test]
fn replaces_only_one_way() {
    let new = name("new.service");
    let old = name("old.service");
    let none = Requirements::default();
    let replaces_old = reqs_of("new.service", "Replaces=old.service");
    let replaces_new = reqs_of("old.service", "Replaces=new.service");
    assert!(units_replace((&new, &replaces_old), (&old, &none)));
    assert!(units_replace((&old, &none), (&new, &replaces_old)));
    assert!(!units_replace((&new, &none), (&old, &none)));
    // Each replacing the other is circular and ignored.
    assert!(!units_replace((&new, &replaces_old), (&old, &replaces_new)));
    let replaces_all = reqs_of("new.service", "Replaces=*");
    assert!(!units_replace((&new, &replaces_all), (&new, &replaces_all)));
}

#[test]
fn matches_metadata_or_within_a_key_and_across_keys() {
    let machine: BTreeMap<String, String> = [("region", "us"), ("disk", "ssd")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let table: &[(&str, bool)] = &[
        ("", true),
        ("MachineMetadata=region=us", true),
        ("MachineMetadata=region=eu", false),
        ("MachineMetadata=region=eu\nMachineMetadata=region=us", true),
        ("MachineMetadata=\"region=eu\" \"region=us\"", true),
        ("MachineMetadata=region=us\nMachineMetadata=disk=ssd", true),
        ("MachineMetadata=region=us\nMachineMetadata=disk=hdd", false),
        ("MachineMetadata=region=us\nMachineMetadata=gpu=yes", false),
        ("MachineMetadata=Region=us", false),
        ("MachineMetadata=region=US", false),
        // Ignored values ask for nothing.
        ("MachineMetadata=garbage", true),
    ];
    for (lines, want) in table {
        assert_eq!(reqs(lines).metadata_matches(&machine), *want, "{lines:?}");
    }
    assert!(reqs("").metadata_matches(&BTreeMap::new()));
    assert!(!reqs("MachineMetadata=region=us").metadata_matches(&BTreeMap::new()));
}

#[test]
fn matches_the_machine_by_full_or_short_id() {
    let machine: MachineId = "2c4a8cf5e4d04a1d9b8f0e5c6a7b8c9d".parse().unwrap();
    let table: &[(&str, bool)] = &[
        ("", true),
        ("MachineID=2c4a8cf5e4d04a1d9b8f0e5c6a7b8c9d", true),
        ("MachineID=2c4a8cf5", true),
        ("MachineID=2c4a8cf", false),
        ("MachineID=2c4a8cf5e", false),
        ("MachineID=2C4A8CF5", false),
        ("MachineID=", false),
        ("X-ConditionMachineID=2c4a8cf5", true),
    ];
    for (lines, want) in table {
        assert_eq!(reqs(lines).machine_id_matches(&machine), *want, "{lines:?}");
    }
    let short: MachineId = "abc".parse().unwrap();
    assert!(reqs("MachineID=abc").machine_id_matches(&short));
}

proptest! {
    #[test]
    fn quoted_values_split_into_what_was_quoted(parts in prop::collection::vec("[a-z=.@-]{0,8}", 1..5)) {
        let line = parts.iter().map(|p| format!("\"{p}\"")).collect::<Vec<_>>().join(" ");
        prop_assert_eq!(split_multivalue(&line), parts);
    }

    #[test]
    fn validation_never_lets_a_peer_match_a_conflict(
        peers in prop::collection::vec("[ab*?.]{1,4}", 0..3),
        conflicts in prop::collection::vec("[ab*?.]{1,4}", 0..3),
    ) {
        let r = Requirements { machine_of: peers, conflicts, ..Requirements::default() };
        if r.validate().is_ok() {
            for p in &r.machine_of {
                prop_assert!(!r.conflicts.iter().any(|c| glob_match(c, p)));
            }
        }
    }
}

fn check(unit: &str, lines: &str) -> Result<(), String> {
    let text = format!("[Service]\nExecStart=/bin/true\n[X-Fleet]\n{lines}\n");
    check_values(&name(unit), &UnitFile::parse(text.as_bytes()).unwrap()).map_err(|e| e.to_string())
}

#[test]
fn values_fleet_took_silently_are_refused_at_the_door() {
    let table: &[(&str, &str)] = &[
        (
            "MachineID=../../etc",
            r#"MachineID "../../etc" is not a machine ID: invalid character '.' in machine ID"#,
        ),
        (
            "MachineID=",
            r#"MachineID "" is not a machine ID: machine ID cannot be empty"#,
        ),
        ("MachineOf=%n", "MachineOf cannot name the unit itself"),
        (
            "MachineOf=web@1.service",
            "MachineOf cannot name the unit itself",
        ),
        (
            "MachineOf=db@.service",
            r#"MachineOf "db@.service" names a template, which never runs: name one of its instances"#,
        ),
        (
            "Replaces=web@1.service",
            r#"Replaces "web@1.service" names the unit itself, which could never be placed"#,
        ),
        (
            "MachineOf=bad name.service",
            r#"MachineOf "bad name.service" is not a unit name: invalid character ' ' in unit name"#,
        ),
        ("Conflicts=[", r#"Conflicts "[" is not a valid glob"#),
        (
            "X-Conflicts=a.service [",
            r#"Conflicts "[" is not a valid glob"#,
        ),
        (
            "Replaces=bad name",
            r#"Replaces "bad name" can never match a unit name"#,
        ),
        (
            "Conflicts=etc/*.service",
            r#"Conflicts "etc/*.service" can never match a unit name"#,
        ),
        (
            "MachineMetadata=noequals",
            r#"MachineMetadata "noequals" is not key=value"#,
        ),
        (
            "MachineMetadata==x",
            r#"MachineMetadata "=x" is not key=value"#,
        ),
        (
            "MachineMetadata=a=b=c",
            r#"MachineMetadata "a=b=c" is not key=value"#,
        ),
        (
            "Global=yesplease",
            r#"Global "yesplease" is not true or false"#,
        ),
    ];
    for (lines, want) in table {
        assert_eq!(
            check("web@1.service", lines),
            Err((*want).to_owned()),
            "{lines}"
        );
    }
}

#[test]
fn values_that_mean_what_they_say_pass_the_door() {
    for lines in [
        "MachineID=0123456789abcdef0123456789abcdef",
        "MachineID=01234567",
        "MachineOf=db.service",
        "MachineOf=db@%i.service",
        "Conflicts=web@*.service db?.service",
        "Replaces=old-[a-c].service",
        "MachineMetadata=region=us-west",
        "MachineMetadata=\"region=a\" \"az=b\"",
        "Global=true",
        "Global=FALSE",
        "Global=off",
        "Global=",
        "MachineMetadata=",
        "SomethingElse=whatever",
    ] {
        assert_eq!(check("web@1.service", lines), Ok(()), "{lines}");
    }
}

#[test]
fn a_template_is_checked_once_instantiated() {
    // `%i` is empty in the template itself.
    assert_eq!(check("pin@.service", "MachineID=%i"), Ok(()));
    assert_eq!(
        check("meta@.service", "MachineMetadata=hostname=%i"),
        Ok(())
    );
    assert!(check("pin@x.y.service", "MachineID=%i").is_err());
}

#[test]
fn the_engine_keeps_fleets_reading_of_values_the_door_refuses() {
    // A unit stored before the door checked them stays schedulable as fleet read it.
    let r = reqs("MachineMetadata=noequals\nGlobal=yesplease\nConflicts=[");
    assert_eq!(r.validate(), Ok(()));
    assert!(!r.global);
    assert!(r.metadata.is_empty());
}
