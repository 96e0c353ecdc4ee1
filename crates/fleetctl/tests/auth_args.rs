//! `fleetctl auth` and the etcd credentials flags, refused at the door (issue 17): each bad
//! combination exits non-zero with a sentence naming the flag, before any connection is made
//! (the endpoints here lead nowhere). What the commands do to a real etcd is tested with etcd's
//! auth on in functional-tests/tests/etcd_auth.rs.

use std::process::{Command, Output};

/// fleetctl with `args` and no FLEETCTL_ variable of the caller's.
fn fleetctl(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FLEETCTL_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied()).args(args).output().unwrap()
}

fn refused(args: &[&str], env: &[(&str, &str)], code: i32) -> String {
    let out = fleetctl(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(out.stdout.is_empty(), "{args:?}");
    stderr
}

/// An etcd endpoint nothing listens on (port 9 of loopback: discard, never served here).
const NOWHERE: &str = "--endpoint=http://127.0.0.1:9";

#[test]
fn auth_over_the_api_driver_is_refused_saying_to_use_etcd() {
    let e = refused(&["auth", "list"], &[], 1);
    assert!(e.contains("use --driver=etcd"), "{e}");
    let e = refused(&["--driver=api", "auth", "setup"], &[], 1);
    assert!(e.contains("fleet's API has no user administration"), "{e}");
}

#[test]
fn a_username_without_a_password_is_refused_before_connecting() {
    let e = refused(
        &["--driver=etcd", NOWHERE, "--username=ops", "list-units"],
        &[],
        1,
    );
    assert!(e.contains("--username \"ops\" needs a password"), "{e}");
    let e = refused(
        &["--driver=etcd", NOWHERE, "list-units"],
        &[("FLEETCTL_PASSWORD", "hunter2")],
        1,
    );
    assert!(
        e.contains("needs --username") && !e.contains("hunter2"),
        "{e}"
    );
}

#[test]
fn etcd_credentials_over_the_api_driver_are_refused() {
    let e = refused(
        &["--driver=api", "list-units"],
        &[("FLEETCTL_USERNAME", "ops")],
        1,
    );
    assert!(e.contains("for --driver=etcd"), "{e}");
}

#[test]
fn there_is_no_password_flag() {
    let e = refused(&["--password=x", "list-units"], &[], 2);
    assert!(e.contains("--password"), "{e}");
}

#[test]
fn auth_commands_need_their_password_files_and_a_valid_machine_id() {
    let e = refused(&["auth", "add-host", "m1"], &[], 2);
    assert!(e.contains("--host-password-file"), "{e}");
    let e = refused(&["auth", "setup", "--enable"], &[], 2);
    assert!(e.contains("--root-password-file"), "{e}");
    let e = refused(&["auth", "setup", "--operator=ops"], &[], 2);
    assert!(e.contains("--operator-password-file"), "{e}");
    let e = refused(
        &[
            "--driver=etcd",
            NOWHERE,
            "auth",
            "add-host",
            "m1",
            "--host-password-file=/nonexistent/pw",
        ],
        &[],
        1,
    );
    assert!(
        e.contains("reading the password file /nonexistent/pw"),
        "{e}"
    );
    let e = refused(
        &["--driver=etcd", NOWHERE, "auth", "remove-host", "a b"],
        &[],
        1,
    );
    assert!(e.contains("invalid machine ID \"a b\""), "{e}");
}
