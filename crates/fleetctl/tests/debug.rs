//! `fleetctl --debug`: fleet's own debug lines, without the HTTP/2 stack's internals, and no
//! colour codes when stderr is not a terminal.

use fleet_testing::TestEtcd;
use std::process::Command;

#[tokio::test]
async fn debug_output_is_fleets_own_and_uncoloured_when_piped() {
    let etcd = TestEtcd::start().await;
    let out = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args([
            "--debug",
            "--driver",
            "etcd",
            "--endpoint",
            &etcd.endpoint(),
            "list-units",
        ])
        .env_remove("FLEETCTL_ENDPOINT")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe:\n{stderr}"
    );
    for noise in ["h2::", "hyper", "tower", "tonic"] {
        assert!(
            !stderr
                .lines()
                .any(|l| l.contains(noise) && l.contains("DEBUG")),
            "{noise} debug lines:\n{stderr}"
        );
    }
}
