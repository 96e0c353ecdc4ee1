//! The decision table: every route's action, what each role may do, the role keys'
//! subjects, and a certificate's subject read from DER.

use super::*;
use crate::PREFIXES;

fn unit(desired: &str, with_options: bool) -> Vec<u8> {
    let options = if with_options {
        serde_json::json!([{"section": "Service", "name": "ExecStart", "value": "/bin/true"}])
    } else {
        serde_json::json!([])
    };
    serde_json::json!({"desiredState": desired, "options": options})
        .to_string()
        .into_bytes()
}

/// A request's method, path after the prefix, query and body, and the action it does.
type Row<'a> = (Method, &'a str, &'a str, Option<&'a [u8]>, Option<Action>);

/// Every route of the router (routes.rs `route`) with every method it takes, and what that
/// does; a method a route does not take has no action (the router answers 405 or 400).
#[test]
fn every_route_and_method_names_its_action() {
    use Action::*;
    let launched = unit("launched", false);
    let loaded = unit("loaded", false);
    let inactive = unit("inactive", false);
    let submitted = unit("", true);
    let started_new = unit("launched", true);
    let creates_launched =
        br#"{"units":[{"name":"a.service"},{"name":"b.service","desiredState":"launched"}]}"#
            .to_vec();
    let creates_loaded = br#"{"units":[{"name":"a.service","desiredState":"loaded"}]}"#.to_vec();
    let table: Vec<Row> = vec![
        (Method::GET, "/units", "", None, Some(List)),
        (Method::GET, "/units/a.service", "", None, Some(Cat)),
        (Method::GET, "/units/a%40b.service", "", None, Some(Cat)),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(&submitted),
            Some(Submit),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(&started_new),
            Some(Start),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(&launched),
            Some(Start),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(&loaded),
            Some(Load),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(&inactive),
            Some(Unload),
        ),
        (Method::PUT, "/units/a.service", "", None, Some(Submit)),
        (
            Method::PUT,
            "/units/a.service",
            "",
            Some(b"not json"),
            Some(Submit),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "expect=abc",
            Some(&submitted),
            Some(Replace),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "expect=absent",
            Some(&submitted),
            Some(Submit),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "rolling=true",
            Some(&submitted),
            Some(Replace),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "reschedule=1",
            Some(&submitted),
            Some(Replace),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "noRestart=true",
            Some(&submitted),
            Some(Replace),
        ),
        (Method::PUT, "/units/a.service", "op=stop", None, Some(Stop)),
        (
            Method::PUT,
            "/units/a.service",
            "op=unload",
            None,
            Some(Unload),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=restart",
            None,
            Some(Restart),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=raise",
            Some(&launched),
            Some(Start),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=raise",
            Some(&loaded),
            Some(Load),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=advanceRollout&machineID=m",
            None,
            Some(Replace),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=finishRollout",
            None,
            Some(Replace),
        ),
        (
            Method::PUT,
            "/units/a.service",
            "op=nonsense",
            None,
            Some(Submit),
        ),
        (Method::DELETE, "/units/a.service", "", None, Some(Destroy)),
        (Method::POST, "/units/a.service", "", None, None),
        (Method::PUT, "/units", "", None, None),
        (Method::POST, "/units", "", None, None),
        (Method::POST, "/units", "view=full", None, Some(Submit)),
        (
            Method::POST,
            "/units",
            "view=full",
            Some(&creates_launched),
            Some(Start),
        ),
        (
            Method::POST,
            "/units",
            "view=full",
            Some(&creates_loaded),
            Some(Load),
        ),
        (Method::GET, "/state", "machineID=m", None, Some(List)),
        (Method::GET, "/state/a.service", "", None, Some(List)),
        (Method::PUT, "/state/a.service", "", None, None),
        (Method::GET, "/machines", "", None, Some(List)),
        (Method::PATCH, "/machines", "", None, Some(Metadata)),
        (Method::PUT, "/machines", "", None, None),
        (Method::GET, "/discovery", "", None, Some(List)),
        (Method::PUT, "/discovery", "", None, None),
        (Method::GET, "/drains", "", None, Some(List)),
        (Method::PUT, "/drains", "", None, None),
        (Method::GET, "/drains/m1", "", None, Some(List)),
        (Method::PUT, "/drains/m1", "parallel=2", None, Some(Drain)),
        (Method::DELETE, "/drains/m1", "", None, Some(Drain)),
        (Method::PATCH, "/drains/m1", "", None, None),
        (Method::GET, "/explain/a.service", "", None, Some(Explain)),
        (Method::POST, "/import", "", None, Some(Import)),
        (Method::POST, "/import", "view=full", None, Some(Import)),
        (Method::GET, "/import", "", None, None),
        (Method::PUT, "/import", "", None, None),
        (Method::PUT, "/explain/a.service", "", None, None),
        (Method::GET, "/health", "within=100", None, Some(Health)),
        (Method::PUT, "/health", "", None, None),
        (
            Method::GET,
            "/units/a.service/status",
            "",
            None,
            Some(Status),
        ),
        (
            Method::GET,
            "/units/a.service/journal",
            "lines=5",
            None,
            Some(Journal),
        ),
        (Method::DELETE, "/units/a.service/journal", "", None, None),
        (Method::GET, "", "", None, None),
        (Method::GET, "/nope", "", None, None),
        (Method::GET, "/units/", "", None, None),
    ];
    for prefix in PREFIXES {
        for (method, path, query, body, want) in &table {
            let path = format!("{prefix}{path}");
            assert_eq!(
                action_of(method, &path, query, *body),
                *want,
                "{method} {path}?{query}"
            );
        }
    }
    assert_eq!(action_of(&Method::GET, "/", "", None), None);
    assert_eq!(action_of(&Method::GET, "/metrics", "", None), Some(Metrics));
    assert_eq!(action_of(&Method::PUT, "/metrics", "", None), None);
}

#[test]
fn only_puts_of_a_state_and_full_posts_need_their_body_read() {
    assert!(needs_body(&Method::PUT, ""));
    assert!(needs_body(&Method::PUT, "op=raise"));
    assert!(!needs_body(&Method::PUT, "op=stop"));
    assert!(!needs_body(&Method::GET, ""));
    assert!(!needs_body(&Method::DELETE, ""));
    assert!(needs_body(&Method::POST, "view=full"));
    assert!(!needs_body(&Method::POST, ""));
}

#[test]
fn viewers_read_operators_change_units_and_only_admins_import() {
    use Action::*;
    let all = [
        Submit, Load, Start, Stop, Unload, Destroy, Replace, Restart, Drain, Metadata, List, Cat,
        Status, Journal, Explain, Metrics, Import,
    ];
    for action in all {
        assert!(permits(Role::Admin, action), "{action:?}");
        assert_eq!(
            permits(Role::Operator, action),
            action != Import,
            "{action:?}"
        );
        assert_eq!(
            permits(Role::Viewer, action),
            action.is_read(),
            "{action:?}"
        );
    }
    let reads: Vec<Action> = all.into_iter().filter(|a| a.is_read()).collect();
    assert_eq!(reads, [List, Cat, Status, Journal, Explain, Metrics]);
}

#[test]
fn subjects_are_cn_or_o_and_anything_else_is_refused() {
    assert_eq!("CN=bob".parse(), Ok(Subject::Cn("bob".into())));
    assert_eq!("cn=bob smith".parse(), Ok(Subject::Cn("bob smith".into())));
    assert_eq!("O=ops".parse(), Ok(Subject::O("ops".into())));
    for bad in [
        "bob", "CN=", "OU=ops", "CN= bob", "CN=bob\n", "=bob", "C=DE",
    ] {
        assert_eq!(
            bad.parse::<Subject>(),
            Err(RolesError::BadSubject(bad.into())),
            "{bad:?}"
        );
    }
    assert_eq!(Subject::O("ops".into()).to_string(), "O=ops");
}

#[test]
fn the_same_subject_in_two_roles_is_an_error_and_twice_in_one_is_not() {
    let bob = || Subject::Cn("bob".into());
    let e = Roles::new([(bob(), Role::Admin), (bob(), Role::Viewer)]).unwrap_err();
    assert_eq!(e.to_string(), "CN=bob is given two roles, viewer and admin");
    let roles = Roles::new([(bob(), Role::Viewer), (bob(), Role::Viewer)]).unwrap();
    assert!(!roles.is_empty());
}

#[test]
fn a_certificates_cn_wins_over_its_groups_and_the_highest_group_counts() {
    let roles = Roles::new([
        (Subject::Cn("bob".into()), Role::Viewer),
        (Subject::O("ops".into()), Role::Operator),
        (Subject::O("dev".into()), Role::Viewer),
        (Subject::O("root".into()), Role::Admin),
    ])
    .unwrap();
    let cert = |cn: &str, orgs: &[&str]| CertSubject {
        common_names: vec![cn.to_owned()],
        organizations: orgs.iter().map(|o| o.to_string()).collect(),
    };
    assert_eq!(roles.role_of(&cert("bob", &["root"])), Some(Role::Viewer));
    assert_eq!(
        roles.role_of(&cert("eve", &["dev", "ops"])),
        Some(Role::Operator)
    );
    assert_eq!(
        roles.role_of(&cert("eve", &["root", "dev"])),
        Some(Role::Admin)
    );
    assert_eq!(roles.role_of(&cert("eve", &["guests"])), None);
    assert_eq!(roles.role_of(&CertSubject::default()), None);
}

#[test]
fn the_socket_and_plain_tcp_are_admin_and_a_certificate_has_its_role() {
    let roles = Roles::new([(Subject::Cn("bob".into()), Role::Viewer)]).unwrap();
    let cert = |cn: &str| {
        Peer::Certificate(Some(CertSubject {
            common_names: vec![cn.into()],
            organizations: vec![],
        }))
    };
    let role = |peer: Option<&Peer>, roles: Option<&Roles>| Principal::of(peer, roles).role;
    assert_eq!(role(Some(&Peer::Local), Some(&roles)), Some(Role::Admin));
    assert_eq!(role(Some(&Peer::Plain), Some(&roles)), Some(Role::Admin));
    assert_eq!(role(None, Some(&roles)), Some(Role::Admin));
    assert_eq!(role(Some(&cert("bob")), Some(&roles)), Some(Role::Viewer));
    assert_eq!(role(Some(&cert("eve")), Some(&roles)), None);
    assert_eq!(role(Some(&cert("eve")), None), Some(Role::Admin));
    assert_eq!(role(Some(&Peer::Certificate(None)), Some(&roles)), None);
}

#[test]
fn a_certificate_without_a_role_is_refused_even_what_no_route_takes() {
    let nobody = Principal {
        peer: Peer::Certificate(Some(CertSubject {
            common_names: vec!["bob".into()],
            organizations: vec![],
        })),
        role: None,
    };
    for action in [None, Some(Action::List)] {
        assert_eq!(
            decide(&nobody, action),
            Err(Refusal::NoRole("CN=bob".into()))
        );
    }
    // A peer fleetd asks whether this machine reaches etcd with its own certificate, which
    // no role names (issue 36).
    assert_eq!(decide(&nobody, Some(Action::Health)), Ok(()));
    let viewer = Principal {
        role: Some(Role::Viewer),
        ..nobody
    };
    assert_eq!(decide(&viewer, Some(Action::List)), Ok(()));
    assert_eq!(decide(&viewer, None), Ok(()));
    assert_eq!(
        decide(&viewer, Some(Action::Start)),
        Err(Refusal::Forbidden {
            role: Role::Viewer,
            action: Action::Start
        })
    );
}

/// A certificate made by `openssl` with two O values, read back from DER.
#[test]
fn reads_the_cn_and_every_o_of_a_der_certificate() {
    let dir = std::env::temp_dir().join(format!("fleet-api-authz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "k.pem",
            "-outform",
            "DER",
            "-out",
            "c.der",
            "-days",
            "1",
            "-subj",
            "/O=dev/O=ops/CN=bob",
        ])
        .current_dir(&dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let der = std::fs::read(dir.join("c.der")).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let subject = CertSubject::from_der(&der).unwrap();
    assert_eq!(subject.common_names, ["bob"]);
    assert_eq!(subject.organizations, ["dev", "ops"]);
    assert_eq!(subject.to_string(), "CN=bob, O=dev, O=ops");
    assert_eq!(CertSubject::from_der(b"not der"), None);
}

/// Issue 37, item 5: a denied subject has no role, whatever its CN or groups would give; a
/// `CN=` entry could lower a group's role only to viewer before.
#[test]
fn a_denied_subject_has_no_role_whatever_its_other_names_give() {
    let roles = Roles::new([
        (Subject::O("ops".into()), Role::Admin),
        (Subject::Cn("mallory".into()), Role::Viewer),
    ])
    .unwrap()
    .denying([
        Subject::Cn("mallory".into()),
        Subject::O("contractors".into()),
    ]);
    let cert = |cn: &str, orgs: &[&str]| CertSubject {
        common_names: vec![cn.to_owned()],
        organizations: orgs.iter().map(|o| o.to_string()).collect(),
    };
    assert_eq!(roles.role_of(&cert("alice", &["ops"])), Some(Role::Admin));
    assert_eq!(roles.role_of(&cert("mallory", &["ops"])), None);
    assert_eq!(roles.role_of(&cert("bob", &["ops", "contractors"])), None);
}
