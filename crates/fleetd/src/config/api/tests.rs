use super::*;

/// The API's configuration the whole configuration gives (its keys are rows of `KEYS`).
fn build(raw: &BTreeMap<String, Raw>) -> Result<ApiConfig> {
    super::super::build(raw, &mut vec![]).map(|c| c.api)
}

fn raw(pairs: &[(&str, &str)]) -> BTreeMap<String, Raw> {
    pairs
        .iter()
        .map(|(k, v)| {
            let raw = Raw {
                value: v.to_string(),
                source: "test".into(),
            };
            (k.to_string(), raw)
        })
        .collect()
}

#[test]
fn defaults_to_fleets_socket_and_page_size() {
    let c = build(&raw(&[])).unwrap();
    assert_eq!(c.token_limit, 100);
    assert_eq!(c.socket, Some(PathBuf::from("/var/run/fleet.sock")));
    assert!(c.listen.is_empty());
    assert_eq!(build(&raw(&[("api_socket", "")])).unwrap().socket, None);
    assert!(c.held_view);
}

#[test]
fn the_held_view_can_be_turned_off_and_a_bad_value_is_refused() {
    let off = build(&raw(&[("api_held_view", "false")])).unwrap();
    assert!(!off.held_view);
    let err = build(&raw(&[("api_held_view", "sometimes")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid api_held_view \"sometimes\" (test): expected true or false"
    );
}

#[test]
fn takes_unix_and_loopback_tcp_listeners() {
    let c = build(&raw(&[(
        "api_listen",
        "unix:/tmp/a.sock, tcp:127.0.0.1:54728,[::1]:1",
    )]))
    .unwrap();
    assert_eq!(
        c.listen,
        vec![
            ListenAddr::Unix("/tmp/a.sock".into()),
            ListenAddr::Tcp("127.0.0.1:54728".parse().unwrap()),
            ListenAddr::Tcp("[::1]:1".parse().unwrap()),
        ]
    );
}

#[test]
fn refuses_plain_tcp_on_other_addresses_unless_allowed() {
    let e = build(&raw(&[("api_listen", "10.1.2.3:54728")])).unwrap_err();
    assert!(e.to_string().contains("not a loopback address"), "{e}");
    let c = build(&raw(&[
        ("api_listen", "10.1.2.3:54728"),
        ("api_allow_plain_tcp", "true"),
    ]))
    .unwrap();
    assert_eq!(c.listen.len(), 1);
}

#[test]
fn takes_tcp_on_any_address_with_all_three_tls_files() {
    let c = build(&raw(&[
        ("api_listen", "10.1.2.3:54728"),
        ("api_cafile", "/etc/fleet/ca.pem"),
        ("api_certfile", "/etc/fleet/api.pem"),
        ("api_keyfile", "/etc/fleet/api.key"),
    ]))
    .unwrap();
    assert_eq!(c.listen.len(), 1);
    assert_eq!(
        c.tls,
        Some(ApiTlsFiles {
            ca: "/etc/fleet/ca.pem".into(),
            cert: "/etc/fleet/api.pem".into(),
            key: "/etc/fleet/api.key".into(),
            crl: None,
        })
    );
    assert_eq!(build(&raw(&[])).unwrap().tls, None);
}

#[test]
fn refuses_some_of_the_tls_files_without_the_others() {
    let e = build(&raw(&[
        ("api_certfile", "/etc/fleet/api.pem"),
        ("api_keyfile", "/etc/fleet/api.key"),
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("missing api_cafile"), "{e}");
    let e = build(&raw(&[("api_cafile", "/etc/fleet/ca.pem")])).unwrap_err();
    assert!(
        e.to_string().contains("missing api_certfile, api_keyfile"),
        "{e}"
    );
}

#[test]
fn api_advertise_takes_an_http_or_https_url_of_host_and_port() {
    let url = |v: &str| build(&raw(&[("api_advertise", v)])).map(|c| c.advertise);
    assert_eq!(build(&raw(&[])).unwrap().advertise, Advertise::Derived);
    assert_eq!(url("").unwrap(), Advertise::Nothing);
    for (given, kept) in [
        ("https://10.0.0.2:49153", "https://10.0.0.2:49153"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("https://[fe80::1]:443", "https://[fe80::1]:443"),
        (
            "https://node-1.example.com:49153",
            "https://node-1.example.com:49153",
        ),
    ] {
        assert_eq!(
            url(given).unwrap(),
            Advertise::Url(kept.to_owned()),
            "{given}"
        );
    }
}

#[test]
fn api_advertise_refuses_what_is_no_such_url_and_says_why() {
    for (value, why) in [
        ("10.0.0.2:49153", "expected https://HOST:PORT"),
        ("ftp://10.0.0.2:21", "scheme \"ftp\" is not https or http"),
        ("https://10.0.0.2", "is not HOST:PORT"),
        ("https://10.0.0.2:0", "port \"0\" is not a number"),
        ("https://10.0.0.2:99999", "port \"99999\""),
        (
            "https://10.0.0.2:80/fleet",
            "has a path or query (\"/fleet\")",
        ),
        ("https://10.0.0.2:1/path", "has a path or query (\"/path\")"),
        ("https://10.0.0.2:1?x=1", "has a path or query (\"?x=1\")"),
        ("https://fe80::1:443", "host \"fe80::1\" is no IP address"),
        ("https://user@host:443", "host \"user@host\""),
        ("https://:443", "is not HOST:PORT"),
    ] {
        let e = build(&raw(&[("api_advertise", value)])).unwrap_err();
        let e = e.to_string();
        assert!(e.starts_with("invalid api_advertise"), "{value}: {e}");
        assert!(e.contains(why), "{value}: {e}");
    }
}

const TLS: [(&str, &str); 3] = [
    ("api_cafile", "/etc/fleet/ca.pem"),
    ("api_certfile", "/etc/fleet/api.pem"),
    ("api_keyfile", "/etc/fleet/api.key"),
];

fn with_tls(pairs: &[(&'static str, &'static str)]) -> BTreeMap<String, Raw> {
    let mut all = TLS.to_vec();
    all.extend_from_slice(pairs);
    raw(&all)
}

#[test]
fn role_keys_give_subjects_their_roles() {
    let c = build(&with_tls(&[
        ("api_admins", "CN=root, O=ops"),
        ("api_operators", "CN=ci"),
        ("api_viewers", " O=dev ,CN=dash,"),
    ]))
    .unwrap();
    let expected = Roles::new([
        (Subject::Cn("root".into()), Role::Admin),
        (Subject::O("ops".into()), Role::Admin),
        (Subject::Cn("ci".into()), Role::Operator),
        (Subject::O("dev".into()), Role::Viewer),
        (Subject::Cn("dash".into()), Role::Viewer),
    ])
    .unwrap();
    assert_eq!(c.roles, expected);
    assert!(build(&with_tls(&[])).unwrap().roles.is_empty());
}

#[test]
fn a_malformed_role_entry_stops_fleetd_naming_its_key() {
    for (key, value) in [
        ("api_admins", "root"),
        ("api_operators", "OU=ops"),
        ("api_viewers", "CN="),
    ] {
        let e = build(&with_tls(&[(key, value)])).unwrap_err().to_string();
        assert!(e.starts_with(&format!("invalid {key} (test)")), "{e}");
        assert!(e.contains("is not CN=<name> or O=<group>"), "{e}");
    }
}

#[test]
fn a_subject_in_two_roles_is_an_error() {
    let e = build(&with_tls(&[
        ("api_admins", "CN=bob"),
        ("api_viewers", "O=dev, CN=bob"),
    ]))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid api roles: CN=bob is given two roles, viewer and admin"
    );
}

#[test]
fn roles_without_tls_are_an_error() {
    let e = build(&raw(&[("api_viewers", "CN=bob")])).unwrap_err();
    assert!(e.to_string().contains("they need api_cafile"), "{e}");
}

#[test]
fn the_socket_group_and_mode_default_to_fleet_and_0660() {
    let c = build(&raw(&[])).unwrap();
    assert_eq!(c.socket_access, SocketAccess::default());
    assert_eq!(c.socket_access.mode, 0o660);
    assert_eq!(c.socket_access.group, SocketGroup::Default);
    let c = build(&raw(&[
        ("api_socket_group", "fleet-users"),
        ("api_socket_mode", "0600"),
    ]))
    .unwrap();
    assert_eq!(
        c.socket_access.group,
        SocketGroup::Name("fleet-users".into())
    );
    assert_eq!(c.socket_access.mode, 0o600);
    let c = build(&raw(&[("api_socket_group", "1000")])).unwrap();
    assert_eq!(c.socket_access.group, SocketGroup::Gid(1000));
    for (key, value) in [
        ("api_socket_group", ""),
        ("api_socket_group", "bad group"),
        ("api_socket_group", "-x"),
        ("api_socket_mode", "0999"),
        ("api_socket_mode", "1777"),
        ("api_socket_mode", "rw"),
    ] {
        let e = build(&raw(&[(key, value)])).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("invalid {key}")),
            "{key}={value}: {e}"
        );
    }
}

#[test]
fn refuses_bad_limits_and_addresses() {
    for pairs in [
        [("token_limit", "0")],
        [("token_limit", "70000")],
        [("api_listen", "unix:relative.sock")],
        [("api_listen", "localhost")],
        [("api_socket", "fleet.sock")],
    ] {
        assert!(build(&raw(&pairs)).is_err(), "{pairs:?}");
    }
}
