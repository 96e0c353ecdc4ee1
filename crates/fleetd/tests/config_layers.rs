//! fleetd's configuration layers as the binary reads them: the file, then `FLEET_<KEY>`
//! variables, then flags, then `--set`. Unit tests cannot set the process environment, so
//! these run `fleetd` itself. Every case holds a bad value, so fleetd stops at its
//! configuration (exit 1, "bad configuration") and never touches the host; which bad value it
//! names shows which layer won.

use std::path::PathBuf;
use std::process::Command;

struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("fleetd-layers-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn config(&self, text: &str) -> String {
        let path = self.0.join("fleet.conf");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// fleetd's refusal: its last line on stderr, after checking that it refused.
fn refusal(env: &[(&str, &str)], args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetd"));
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FLEET_")) {
        cmd.env_remove(k);
    }
    let out = cmd.envs(env.iter().copied()).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default().to_owned();
    assert!(last.starts_with("fleetd: bad configuration: "), "{stderr}");
    last
}

#[test]
fn the_environment_overrides_the_file_and_names_its_variable() {
    let dir = Dir::new("env");
    let conf = dir.config("agent_ttl=never\n");
    let e = refusal(&[("FLEET_AGENT_TTL", "soon")], &["--config", &conf]);
    assert!(
        e.contains("invalid agent_ttl \"soon\" (environment FLEET_AGENT_TTL)"),
        "{e}"
    );
}

#[test]
fn an_empty_variable_counts_as_unset() {
    let dir = Dir::new("empty");
    let conf = dir.config("agent_ttl=never\n");
    let e = refusal(&[("FLEET_AGENT_TTL", "")], &["--config", &conf]);
    assert!(
        e.contains(&format!("invalid agent_ttl \"never\" ({conf}:1)")),
        "{e}"
    );
}

#[test]
fn a_flag_overrides_the_environment_and_set_overrides_the_flag() {
    let dir = Dir::new("flag");
    let conf = dir.config("");
    // agent_ttl is checked before engine_disruption_grace: reaching the grace proves the
    // good flag hid the bad variable.
    let e = refusal(
        &[("FLEET_AGENT_TTL", "soon")],
        &[
            "--config",
            &conf,
            "--agent-ttl",
            "3s",
            "--engine-disruption-grace=later",
        ],
    );
    assert!(
        e.contains("invalid engine_disruption_grace \"later\" (flag --engine-disruption-grace)"),
        "{e}"
    );
    let e = refusal(
        &[],
        &[
            "--config",
            &conf,
            "--agent-ttl=3s",
            "--set",
            "agent_ttl=whenever",
        ],
    );
    assert!(
        e.contains("invalid agent_ttl \"whenever\" (flag --set)"),
        "{e}"
    );
}
