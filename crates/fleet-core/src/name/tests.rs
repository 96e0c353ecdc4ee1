use super::*;
use proptest::prelude::*;

fn message(name: &str) -> String {
    match name.parse::<UnitName>() {
        Ok(n) => panic!("{name:?} was accepted as {n}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn refuses_bad_names_with_fleets_message() {
    let long = format!("{}.service", "a".repeat(MAX_NAME_LEN));
    let ten_kb = "x".repeat(10 * 1024);
    let table: &[(&str, &str)] = &[
        ("", "unit name cannot be empty"),
        (&long, "unit name exceeds maximum length (256)"),
        (&ten_kb, "unit name exceeds maximum length (256)"),
        ("fooservice", r#"unit name must contain ".""#),
        ("bar@foo", r#"unit name must contain ".""#),
        ("no dot here", r#"unit name must contain ".""#),
        ("foo.", r#"unit name cannot end in ".""#),
        ("foo.service.", r#"unit name cannot end in ".""#),
        (".", r#"unit name cannot end in ".""#),
        ("..", r#"unit name cannot end in ".""#),
        ("foo.bar", r#"invalid unit type: "bar""#),
        ("foo.servICE", r#"invalid unit type: "servICE""#),
        ("../x.service", r"invalid character '/' in unit name"),
        ("x/..service", r"invalid character '/' in unit name"),
        ("x.service/..", r#"unit name cannot end in ".""#),
        ("foo.x y", r#"invalid unit type: "x y""#),
        ("foo.\u{1}", r#"invalid unit type: "\x01""#),
        ("foo@.mount", r#"invalid unit type for template: "mount""#),
        (
            "foo@1.automount",
            r#"invalid unit type for template: "automount""#,
        ),
        (
            "foo@1.device",
            r#"invalid unit type for template: "device""#,
        ),
        ("foo@1.slice", r#"invalid unit type for template: "slice""#),
        ("foo@1.swap", r#"invalid unit type for template: "swap""#),
        ("foo@1.scope", r#"invalid unit type for template: "scope""#),
        (
            "foo@1.busname",
            r#"invalid unit type for template: "busname""#,
        ),
        (
            "foo@1.snapshot",
            r#"invalid unit type for template: "snapshot""#,
        ),
        (
            "dog=woof@.mount",
            r#"invalid unit type for template: "mount""#,
        ),
        ("hello world.service", r"invalid character ' ' in unit name"),
        ("foo%.service", r"invalid character '%' in unit name"),
        ("foo$asd.service", r"invalid character '$' in unit name"),
        ("this+that.mount", r"invalid character '+' in unit name"),
        ("yes/no.service", r"invalid character '/' in unit name"),
        ("a\tb.service", r"invalid character '\t' in unit name"),
        ("a\nb.service", r"invalid character '\n' in unit name"),
        ("a\0b.service", r"invalid character '\x00' in unit name"),
        (
            "a\u{1b}[31m.service",
            r"invalid character '\x1b' in unit name",
        ),
        ("a\u{7f}.service", r"invalid character '\x7f' in unit name"),
        (
            "caf\u{e9}.service",
            "invalid character '\u{e9}' in unit name",
        ),
        (
            "a\u{a0}b.service",
            r"invalid character '\u00a0' in unit name",
        ),
        ("@foo.service", r#"unit name cannot start in "@""#),
        ("@this.mount", r#"invalid unit type for template: "mount""#),
        ("@.service", r#"unit name cannot start in "@""#),
        (".service", r#"unit name cannot be ".service""#),
    ];
    for (name, want) in table {
        assert_eq!(message(name), *want, "name {name:?}");
    }
}

#[test]
fn checks_in_fleets_order_when_a_name_has_several_faults() {
    // Length comes before everything, the dot before characters, the type before characters,
    // characters before the leading `@`.
    assert_eq!(
        message(&"/".repeat(300)),
        "unit name exceeds maximum length (256)"
    );
    assert_eq!(message("a/b"), r#"unit name must contain ".""#);
    assert_eq!(message("a b.nope"), r#"invalid unit type: "nope""#);
    assert_eq!(
        message("@a b.service"),
        r"invalid character ' ' in unit name"
    );
}

#[test]
fn accepts_fleets_good_names() {
    let exact = format!("{}.service", "a".repeat(MAX_NAME_LEN - ".service".len()));
    let table: &[&str] = &[
        "foo.service",
        "hello.mount",
        "foo@123.service",
        "foo@.service",
        "yo.yo.service",
        "hello@world.path",
        "hello:world.service",
        r"yes@no\.service",
        r"dev-disk-by\x2dlabel.device",
        "foo-bar.mount",
        "jalapano_chips.service",
        "foo@1.socket",
        "foo@1.target",
        "foo@1.timer",
        "a@b@c.service",
        "..service",
        "multi-user.target",
        "user.slice",
        "file.swap",
        "session-1.scope",
        "org.freedesktop.busname",
        "snap.snapshot",
        &exact,
    ];
    for name in table {
        let parsed: UnitName = name.parse().unwrap_or_else(|e| panic!("{name:?}: {e}"));
        assert_eq!(parsed.as_str(), *name);
    }
}

#[test]
fn splits_plain_template_and_instance_names() {
    // (name, type, stem %N, prefix %p, instance %i, template?, instance?, template of it)
    type Row = (
        &'static str,
        UnitType,
        &'static str,
        &'static str,
        &'static str,
    );
    let table: &[(Row, bool, bool, Option<&str>)] = &[
        (
            ("foo.service", UnitType::Service, "foo", "foo", ""),
            false,
            false,
            None,
        ),
        (
            ("a.b.socket", UnitType::Socket, "a.b", "a.b", ""),
            false,
            false,
            None,
        ),
        (
            ("web@.service", UnitType::Service, "web@", "web", ""),
            true,
            false,
            None,
        ),
        (
            ("web@1.service", UnitType::Service, "web@1", "web", "1"),
            false,
            true,
            Some("web@.service"),
        ),
        (
            ("a@b@c.timer", UnitType::Timer, "a@b@c", "a", "b@c"),
            false,
            true,
            Some("a@.timer"),
        ),
        (
            ("x@y.z.path", UnitType::Path, "x@y.z", "x", "y.z"),
            false,
            true,
            Some("x@.path"),
        ),
        (
            (
                "net@eth0.target",
                UnitType::Target,
                "net@eth0",
                "net",
                "eth0",
            ),
            false,
            true,
            Some("net@.target"),
        ),
    ];
    for ((name, ty, stem, prefix, instance), template, is_instance, of) in table {
        let n: UnitName = name.parse().unwrap();
        assert_eq!(n.unit_type(), *ty, "{name}");
        assert_eq!(n.stem(), *stem, "{name}");
        assert_eq!(n.prefix(), *prefix, "{name}");
        assert_eq!(n.instance(), *instance, "{name}");
        assert_eq!(n.is_template(), *template, "{name}");
        assert_eq!(n.is_instance(), *is_instance, "{name}");
        assert_eq!(n.template().as_ref().map(UnitName::as_str), *of, "{name}");
    }
}

#[test]
fn mangles_arguments_like_fleetctl() {
    let table: &[(&str, Result<&str, &str>)] = &[
        ("foo", Ok("foo.service")),
        ("foo.service", Ok("foo.service")),
        ("foo.socket", Ok("foo.socket")),
        ("foo.automount", Ok("foo.automount")),
        ("foo.target", Ok("foo.target.service")),
        ("dir/foo.target", Ok("foo.target.service")),
        ("foo.slice", Ok("foo.slice.service")),
        ("/abs/path/web@1.service", Ok("web@1.service")),
        ("units/web@.service", Ok("web@.service")),
        ("dir/foo", Ok("foo.service")),
        ("dir/", Ok("dir.service")),
        ("foo.", Ok("foo..service")),
        // `destroy ""` once removed a real `..service`: nothing names it from an argument.
        ("", Err("unit name cannot be empty")),
        (".", Err(r#"unit name cannot be ".""#)),
        ("..", Err(r#"unit name cannot be "..""#)),
        ("dir/.", Err(r#"unit name cannot be ".""#)),
        ("dir/..", Err(r#"unit name cannot be "..""#)),
        ("..service", Ok("..service")),
        ("../x.service", Ok("x.service")),
        ("/", Err(r"invalid character '/' in unit name")),
        ("hello world", Err(r"invalid character ' ' in unit name")),
        (
            "foo@.mount",
            Err(r#"invalid unit type for template: "mount""#),
        ),
        ("@x", Err(r#"unit name cannot start in "@""#)),
    ];
    for (arg, want) in table {
        let got = UnitName::from_arg(arg);
        let got = got
            .as_ref()
            .map(UnitName::as_str)
            .map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(str::to_owned), "argument {arg:?}");
    }
}

#[test]
fn appends_the_default_type_to_local_file_paths() {
    assert_eq!(UnitName::with_default_type("dir/foo"), "dir/foo.service");
    assert_eq!(
        UnitName::with_default_type("dir/foo.mount"),
        "dir/foo.mount"
    );
    assert_eq!(
        UnitName::with_default_type("foo.target"),
        "foo.target.service"
    );
}

#[test]
fn roundtrips_through_serde_and_refuses_bad_names_there() {
    let n: UnitName = serde_json::from_str(r#""web@1.service""#).unwrap();
    assert_eq!(n.instance(), "1");
    assert_eq!(serde_json::to_string(&n).unwrap(), r#""web@1.service""#);
    assert!(serde_json::from_str::<UnitName>(r#""../x.service""#).is_err());
}

#[test]
fn knows_every_type_by_its_suffix() {
    for t in UnitType::ACCEPTED {
        assert_eq!(UnitType::from_suffix(t.suffix()), Some(t));
        assert_eq!(t.recognized_by_fleetctl(), UnitType::ALL.contains(&t));
    }
    assert_eq!(UnitType::from_suffix("Service"), None);
}

proptest! {
    #[test]
    fn never_accepts_a_slash_or_control_character(s in "\\PC{0,20}[/\\x00-\\x1f\\x7f\\u{80}-\\u{9f}]\\PC{0,20}\\.(service|mount|target)") {
        prop_assert!(s.parse::<UnitName>().is_err());
    }

    #[test]
    fn never_accepts_anything_outside_fleets_alphabet(s in "\\PC{0,40}") {
        if let Ok(n) = s.parse::<UnitName>() {
            prop_assert!(n.as_str().chars().all(|c| c.is_ascii_alphanumeric() || ":-_.\\@".contains(c)));
            prop_assert!(n.as_str() != "." && n.as_str() != "..");
        }
    }

    #[test]
    fn display_roundtrips(s in "[a-zA-Z0-9:_.\\\\-]{1,40}(@[a-zA-Z0-9:_.\\\\-]{0,20})?\\.(service|socket|timer|path|target)") {
        let n: UnitName = s.parse().unwrap();
        prop_assert_eq!(n.to_string(), s.clone());
        prop_assert_eq!(n.to_string().parse::<UnitName>().unwrap(), n);
    }
}
