//! `make demo`'s promise: every command it prints works inside the demo, `fleetctl status`
//! and `fleetctl journal` from the host included (over each machine's TLS API). Runs
//! `scripts/demo.sh` into a run directory of its own, then each printed command as a user
//! would paste it (the "Use it" lines in one shell, each machine's nsenter line with the
//! address-less fleetctl typed inside, the teardown line). Needs root.

use anyhow::{Context, Result, bail};
use fleet_functional_tests::{cleanup_stale, default_bin_dir, functional_dir};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// Tears the demo cluster down if the test did not get to its own teardown line.
struct Demo(PathBuf);

impl Drop for Demo {
    fn drop(&mut self) {
        if self.0.join("cluster.json").exists() {
            let _ = Command::new(default_bin_dir().join("fleet-cluster"))
                .arg("down")
                .arg("--dir")
                .arg(&self.0)
                .status();
        }
    }
}

fn bash(script: &str, stdin: Option<&str>) -> Result<Output> {
    use std::io::Write;
    let mut child = Command::new("bash")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut input = child.stdin.take().context("no stdin")?;
    input.write_all(stdin.unwrap_or("").as_bytes())?;
    drop(input);
    Ok(child.wait_with_output()?)
}

fn ok(what: &str, out: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The indented lines that follow the line ending in `heading`, up to the next blank line.
fn block<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| !l.trim_end().ends_with(heading))
        .skip(1)
        .skip_while(|l| l.trim().is_empty() || !l.starts_with("  "))
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect()
}

/// How the demo is told where the binaries are.
#[derive(Debug, Clone, Copy)]
enum Binaries {
    /// `FLEET_BIN_DIR`, as `make demo` starts it.
    Named,
    /// Not at all: `bash scripts/demo.sh` alone finds them in cargo's target directory
    /// (`CARGO_TARGET_DIR`, else `target/`).
    Found,
}

#[test]
fn every_command_the_demo_prints_works_in_the_demo() -> Result<()> {
    cleanup_stale()?;
    demo_works(Binaries::Named)?;
    demo_works(Binaries::Found)
}

fn demo_works(binaries: Binaries) -> Result<()> {
    let dir = functional_dir().join(format!("demo-{}-{binaries:?}", std::process::id()));
    let _demo = Demo(dir.clone());
    let script = workspace().join("scripts/demo.sh");
    let mut command = Command::new("bash");
    command.arg(&script).arg(&dir);
    match binaries {
        Binaries::Named => command.env("FLEET_BIN_DIR", default_bin_dir()),
        Binaries::Found => {
            let target = default_bin_dir()
                .parent()
                .context("the binaries' directory has no parent")?
                .to_path_buf();
            command
                .env_remove("FLEET_BIN_DIR")
                .env("CARGO_TARGET_DIR", target)
        }
    };
    let out = command.output()?;
    let printed = ok("scripts/demo.sh", out)?;
    assert!(printed.contains("hello.service"), "{printed}");

    // The "Use it" lines, pasted into one shell in order, as a user would.
    let usage = block(&printed, "Use it:");
    for command in [
        "fleetctl list-units",
        "fleetctl status hello.service",
        "fleetctl journal hello.service",
        "fleetctl ui",
    ] {
        assert!(
            usage.iter().any(|l| l.starts_with(command)),
            "{command} in {printed}"
        );
    }
    // Then the etcd driver's lines, in the same shell (issue 38: status needs the API's files
    // while etcd's are other ones, or none).
    let over_etcd = block(&printed, "with the API files above):");
    assert!(
        over_etcd
            .iter()
            .any(|l| l.ends_with("fleetctl status hello.service")),
        "{printed}"
    );
    let session = format!(
        "set -e\nshopt -s expand_aliases\n{}\necho over-etcd\n{}\n",
        usage.join("\n"),
        over_etcd.join("\n")
    );
    let file = dir.join("usage.sh");
    std::fs::write(&file, &session)?;
    let listed = ok(
        &format!("the demo's commands:\n{session}"),
        Command::new("bash").arg(&file).output()?,
    )?;
    assert!(listed.contains("Description=Hello World"), "{listed}");
    // status and journal, from the host, through the TLS API of the unit's own fleetd.
    assert!(listed.contains("Active: active (running)"), "{listed}");
    assert!(listed.contains("Hello, world"), "{listed}");
    let (_, etcd_part) = listed.split_once("over-etcd").context("no etcd part")?;
    assert!(
        etcd_part.contains("hello.service") && etcd_part.contains("Active: active (running)"),
        "{listed}"
    );

    // Each machine's nsenter line, with a command typed into the shell it opens.
    let machines: Vec<&str> = printed
        .lines()
        .filter_map(|l| l.find("nsenter ").map(|at| &l[at..]))
        .collect();
    assert_eq!(machines.len(), 3, "{printed}");
    // Inside, fleetctl with no address reaches that machine's fleetd over its socket.
    let inside = printed
        .lines()
        .find_map(|l| {
            l.split('`')
                .nth(1)
                .filter(|c| c.ends_with("fleetctl list-units"))
        })
        .context("no fleetctl line for inside a machine")?;
    for enter in machines {
        let typed = format!("systemctl is-system-running\n{inside} --no-legend\n");
        let out = ok(enter, bash(enter, Some(&typed))?)?;
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("running"), "{enter}: {out}");
        assert!(
            lines.any(|l| l.starts_with("hello.service\t")),
            "{inside} in {enter}: {out}"
        );
    }

    // The teardown line (the first one of its block).
    let teardown = block(&printed, "Tear it down:");
    let down = teardown.first().context("no teardown line")?;
    ok(down, bash(down, None)?)?;
    assert!(
        !dir.join("cluster.json").exists(),
        "{down} left the cluster up"
    );
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
