use super::*;
use clap::Parser;

fn global(args: &[&str]) -> Global {
    let mut argv = vec!["fleetctl"];
    argv.extend_from_slice(args);
    argv.push("version");
    crate::cli::Cli::parse_from(argv).global
}

fn machine(id: &str, ip: &str, api: &str) -> (MachineId, MachineInfo) {
    let id: MachineId = id.parse().unwrap();
    let info = MachineInfo {
        id: id.clone(),
        public_ip: ip.into(),
        metadata: Default::default(),
        version: String::new(),
        disable_engine: false,
        api: api.into(),
        fence_at: None,
    };
    (id, info)
}

const THIS: &str = "0123456789abcdef0123456789abcdef";
const OTHER: &str = "fedcba9876543210fedcba9876543210";

fn here(socket: Option<&str>, ssh: bool) -> Here {
    Here {
        machine: Some(THIS.into()),
        socket: socket.map(str::to_owned),
        ssh,
        http_remote: false,
    }
}

/// Issue 38, item 6: etcd and the fleetds may have different authorities, so the
/// `--api-*` files, when given, are the ones status and journal present to fleetds.
#[test]
fn the_api_files_reach_fleetds_and_the_shared_ones_otherwise() {
    let shared = global(&["--ca-file", "/etcd-ca.pem"]);
    assert_eq!(
        Reach::of(&shared).tls.ca_file.as_deref(),
        Some(std::path::Path::new("/etcd-ca.pem"))
    );
    let both = global(&[
        "--ca-file",
        "/etcd-ca.pem",
        "--api-ca-file",
        "/api-ca.pem",
        "--api-cert-file",
        "/me.pem",
        "--api-key-file",
        "/me.key",
    ]);
    let tls = Reach::of(&both).tls;
    assert_eq!(
        tls.ca_file.as_deref(),
        Some(std::path::Path::new("/api-ca.pem"))
    );
    assert_eq!(
        tls.key_file.as_deref(),
        Some(std::path::Path::new("/me.key"))
    );
}

/// Issue 37, item 8: a machine's published address is what that host says. Only
/// `https://HOST:PORT` is followed by default; `http://` with `--allow-http-remote`;
/// never a socket, a path, credentials or a control character.
#[test]
fn only_an_https_host_and_port_a_machine_publishes_is_followed() {
    let asked = |api: &str, http_remote: bool| {
        let (id, info) = machine(OTHER, "10.0.0.2", api);
        let here = Here {
            http_remote,
            ..here(None, false)
        };
        route(&here, &id, Some(&info)).map_err(|e| e.to_string())
    };
    assert_eq!(
        asked("https://10.0.0.2:49153", false).unwrap(),
        Route::Api("https://10.0.0.2:49153".into())
    );
    assert!(
        asked("http://10.0.0.2:49153", false)
            .unwrap_err()
            .contains("--allow-http-remote")
    );
    assert_eq!(
        asked("http://10.0.0.2:49153", true).unwrap(),
        Route::Api("http://10.0.0.2:49153".into())
    );
    for bad in [
        "unix:///var/run/fleet.sock",
        "file:///etc/passwd",
        "https://10.0.0.2:49153/x",
        "https://user:pw@10.0.0.2:49153",
        "https://10.0.0.2",
        "https://10.0.0.2:1\x1b[2J",
    ] {
        let e = asked(bad, true).unwrap_err();
        assert!(e.contains("which fleetctl does not follow"), "{bad}: {e}");
    }
}

#[test]
fn asks_the_fleetd_at_the_address_the_units_machine_publishes() {
    let (id, info) = machine(OTHER, "10.0.0.2", "https://10.0.0.2:49153");
    assert_eq!(
        route(
            &here(Some("unix:///var/run/fleet.sock"), false),
            &id,
            Some(&info)
        )
        .unwrap(),
        Route::Api("https://10.0.0.2:49153".into())
    );
}

#[test]
fn asks_this_machines_fleetd_over_the_drivers_socket_or_runs_systemctl_when_the_unit_runs_here() {
    let (id, info) = machine(THIS, "10.0.0.1", "https://10.0.0.1:49153");
    assert_eq!(
        route(
            &here(Some("unix:///var/run/fleet.sock"), false),
            &id,
            Some(&info)
        )
        .unwrap(),
        Route::Api("unix:///var/run/fleet.sock".into())
    );
    assert_eq!(
        route(&here(None, false), &id, Some(&info)).unwrap(),
        Route::Shell(Target::Local)
    );
}

#[test]
fn falls_back_to_ssh_without_a_published_api_and_always_with_the_ssh_flag() {
    let (id, bare) = machine(OTHER, "10.0.0.2", "");
    let ssh = Route::Shell(Target::Ssh {
        ip: "10.0.0.2".into(),
    });
    assert_eq!(route(&here(None, false), &id, Some(&bare)).unwrap(), ssh);
    let (id, info) = machine(OTHER, "10.0.0.2", "https://10.0.0.2:49153");
    assert_eq!(route(&here(None, true), &id, Some(&info)).unwrap(), ssh);
    let (id, info) = machine(THIS, "10.0.0.1", "https://10.0.0.1:49153");
    let sock = Some("unix:///var/run/fleet.sock");
    assert_eq!(
        route(&here(sock, true), &id, Some(&info)).unwrap(),
        Route::Shell(Target::Local)
    );
    let e = route(&here(None, false), &OTHER.parse().unwrap(), None).unwrap_err();
    assert!(e.to_string().contains("not in the cluster any more"), "{e}");
}

#[test]
fn the_drivers_endpoint_is_a_socket_only_for_the_api_driver_on_unix() {
    let of = |args: &[&str]| Here::of(&global(args)).socket;
    assert_eq!(of(&[]), Some("unix:///var/run/fleet.sock".into()));
    assert_eq!(of(&["--endpoint", "https://10.0.0.1:1"]), None);
    assert_eq!(of(&["--driver", "etcd", "--endpoint", "unix:///x"]), None);
    assert!(Here::of(&global(&["--ssh"])).ssh);
}

#[test]
fn runs_locally_without_ssh() {
    let cmd = vec!["systemctl".to_string(), "status".into()];
    assert_eq!(command_line(&global(&[]), 22, &Target::Local, &cmd), cmd);
}

#[test]
fn builds_fleets_ssh_command_line_with_tunnel_and_quoting() {
    let g = global(&[
        "--tunnel",
        "bastion",
        "--ssh-username",
        "admin",
        "--strict-host-key-checking=false",
        "--known-hosts-file",
        "/k",
    ]);
    let cmd = vec![
        "systemctl".to_string(),
        "status".into(),
        "a b.service".into(),
    ];
    let argv = command_line(
        &g,
        2222,
        &Target::Ssh {
            ip: "10.0.0.2".into(),
        },
        &cmd,
    );
    assert_eq!(argv[1..3], ["-p".to_string(), "2222".into()]);
    assert!(argv.contains(&"StrictHostKeyChecking=no".to_string()));
    assert!(argv.contains(&"UserKnownHostsFile=/k".to_string()));
    assert!(argv.contains(&"admin@bastion:22".to_string()));
    let host = argv.iter().position(|a| a == "10.0.0.2").unwrap();
    assert_eq!(
        argv[host - 3..host],
        ["-l", "admin", "--"].map(String::from)
    );
    assert_eq!(argv.last().unwrap(), "'a b.service'");
}

#[test]
fn refuses_ssh_user_names_and_tunnels_that_would_be_options() {
    for args in [
        &["--ssh-username=-oProxyCommand=touch /tmp/x"][..],
        &["--ssh-username", "a@b"],
        &["--ssh-username", ""],
        &["--tunnel=-oProxyCommand=x"],
        &["--ssh-timeout", "1e20"],
        &["--ssh-timeout", "0.0000001"],
        &["--request-timeout", "1e19"],
    ] {
        let mut argv = vec!["fleetctl"];
        argv.extend_from_slice(args);
        argv.push("version");
        assert!(crate::cli::Cli::try_parse_from(argv).is_err(), "{args:?}");
    }
}
