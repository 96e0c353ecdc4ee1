//! The completion scripts load in the shells they are for, and complete fleetctl's commands;
//! the man pages are written. No cluster is needed, but for the unit names and machine IDs
//! bash completes from one (a test etcd).

use fleet_core::MachineInfo;
use fleet_registry::Registry;
use fleet_testing::{TestEtcd, machine_running};
use std::process::Command;
use std::time::Duration;

fn fleetctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .output()
        .expect("fleetctl runs")
}

/// What bash completes for `fleetctl <word><TAB>` with `script` loaded (it calls the
/// registered function with the words, as bash does), one candidate a line.
fn bash_completes(script: &std::path::Path, word: &str) -> String {
    let line = format!("fleetctl {word}");
    let probe = format!(
        "set -e; source {}; complete -p fleetctl; \
         COMP_WORDS=(fleetctl {word}); COMP_CWORD=1; COMP_LINE='{line}'; COMP_POINT={}; \
         _fleetctl fleetctl {word} fleetctl; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        line.len()
    );
    let bash = Command::new("bash")
        .args(["--noprofile", "--norc", "-c", &probe])
        .output()
        .expect("bash runs");
    assert!(bash.status.success(), "{bash:?}");
    let stdout = String::from_utf8_lossy(&bash.stdout).into_owned();
    // The first line is `complete -p`'s: the function is registered for fleetctl.
    let (registered, candidates) = stdout.split_once('\n').unwrap_or_default();
    assert!(registered.ends_with(" fleetctl"), "{stdout}");
    candidates.to_owned()
}

#[test]
fn the_bash_completion_script_loads_and_completes_commands() {
    let out = fleetctl(&["completion", "bash"]);
    assert!(out.status.success(), "{out:?}");
    let dir = std::env::temp_dir().join(format!("fleetctl-completion-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("fleetctl.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let stdout = bash_completes(&script, "list-u");
    assert!(stdout.contains("list-units"), "{stdout}");
    assert!(stdout.contains("list-unit-files"), "{stdout}");
    let stdout = bash_completes(&script, "set-m");
    assert_eq!(stdout, "set-metadata\n");
    let stdout = bash_completes(&script, "vers");
    assert_eq!(stdout, "version\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unknown_shell_is_refused_with_the_valid_ones() {
    let out = fleetctl(&["completion", "tcsh"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bash") && err.contains("zsh") && err.contains("fish"),
        "{err}"
    );
}

#[test]
fn man_pages_are_written_for_fleetctl_and_its_commands() {
    let dir = std::env::temp_dir().join(format!("fleetctl-man-e2e-{}", std::process::id()));
    let out = fleetctl(&["man", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    for page in ["fleetctl.1", "fleetctl-list-units.1", "fleetctl-destroy.1"] {
        let text = std::fs::read_to_string(dir.join(page)).expect(page);
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}: {text}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What bash completes for the line `fleetctl <line>` (the cursor at its end) with `script`
/// loaded, `env` set: the registered function called as bash calls it.
fn bash_completes_line(script: &std::path::Path, line: &str, env: &[(&str, &str)]) -> Vec<String> {
    // As bash calls it: the command as typed is the first word and the function's $1.
    let full = format!("{} {line}", env!("CARGO_BIN_EXE_fleetctl"));
    let probe = format!(
        "source {script}; f=$(complete -p fleetctl | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p'); \
         COMP_LINE='{full}'; COMP_POINT={point}; read -ra COMP_WORDS <<< \"$COMP_LINE\"; \
         [[ $COMP_LINE == *' ' ]] && COMP_WORDS+=(''); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); \
         prev=${{COMP_WORDS[COMP_CWORD-1]}}; \
         \"$f\" \"${{COMP_WORDS[0]}}\" \"${{COMP_WORDS[COMP_CWORD]}}\" \"$prev\"; \
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script = script.display(),
        point = full.len(),
    );
    let mut bash = Command::new("bash");
    bash.args(["--noprofile", "--norc", "-c", &probe])
        .env_remove("FLEETCTL_ENDPOINT")
        .env_remove("FLEETCTL_DRIVER");
    for (k, v) in env {
        bash.env(k, v);
    }
    let out = bash.output().expect("bash runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn bash_script(dir: &std::path::Path) -> std::path::PathBuf {
    let out = fleetctl(&["completion", "bash"]);
    assert!(out.status.success(), "{out:?}");
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("fleetctl.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    script
}

/// Issue 38: `--driver` is completed with its values, not files.
#[test]
fn the_driver_flag_completes_with_its_values() {
    let dir =
        std::env::temp_dir().join(format!("fleetctl-completion-driver-{}", std::process::id()));
    let script = bash_script(&dir);
    assert_eq!(
        bash_completes_line(&script, "--driver ", &[]),
        ["api", "etcd"]
    );
    assert_eq!(
        bash_completes_line(&script, "list-units --driver e", &[]),
        ["etcd"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A test etcd holding three units (`web`, `worker`, `db`) and one machine (`4f1e2a10aaaa`),
/// with the directory its unit files were written in.
async fn cluster_with_names(dir: &std::path::Path) -> TestEtcd {
    let etcd = TestEtcd::start().await;
    std::fs::create_dir_all(dir).unwrap();
    let endpoint = etcd.endpoint();
    for unit in ["web.service", "worker.service", "db.service"] {
        let path = dir.join(unit);
        std::fs::write(&path, "[Service]\nExecStart=/bin/true\n").unwrap();
        let out = fleetctl(&[
            "--driver=etcd",
            "--endpoint",
            &endpoint,
            "submit",
            path.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
    }
    let registry = Registry::new(etcd.kv().await, fleet_registry::DEFAULT_PREFIX);
    let info = MachineInfo {
        id: "4f1e2a10aaaa".parse().unwrap(),
        public_ip: "10.0.0.1".into(),
        metadata: Default::default(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    machine_running(&registry, &info, Duration::from_secs(3600), &[]).await;
    etcd
}

/// Issue 38: unit names and machine IDs come from the cluster the line reaches: the
/// variables, or the global flags typed on it.
#[tokio::test]
async fn bash_completes_unit_names_and_machine_ids_from_the_cluster() {
    let dir =
        std::env::temp_dir().join(format!("fleetctl-completion-names-{}", std::process::id()));
    let etcd = cluster_with_names(&dir).await;
    let script = bash_script(&dir);
    let endpoint = etcd.endpoint();

    let by_env = [
        ("FLEETCTL_DRIVER", "etcd"),
        ("FLEETCTL_ENDPOINT", endpoint.as_str()),
    ];
    let units = bash_completes_line(&script, "stop w", &by_env);
    assert_eq!(units, ["web.service", "worker.service"]);
    let units = bash_completes_line(&script, "destroy web.service ", &by_env);
    assert!(units.contains(&"db.service".to_owned()), "{units:?}");
    let machines = bash_completes_line(&script, "set-metadata 4f", &by_env);
    assert_eq!(machines, ["4f1e2a10aaaa"]);
    // After the machine come key=value pairs: no names.
    let after = bash_completes_line(&script, "set-metadata 4f1e2a10aaaa 4", &by_env);
    assert_eq!(after, Vec::<String>::new());
    // The global flags typed on the line reach the same cluster, before or after the command.
    let typed = format!("--driver etcd --endpoint={endpoint} cat d");
    assert_eq!(bash_completes_line(&script, &typed, &[]), ["db.service"]);
    let typed = format!("explain --driver=etcd --endpoint {endpoint} d");
    assert_eq!(bash_completes_line(&script, &typed, &[]), ["db.service"]);
    // The value of a flag is not a unit.
    let flag = bash_completes_line(&script, "stop --block-attempts ", &by_env);
    assert!(!flag.contains(&"db.service".to_owned()), "{flag:?}");
    // No cluster there: no names, no noise, at once.
    let nowhere = [("FLEETCTL_ENDPOINT", "unix:///nonexistent/fleet.sock")];
    assert_eq!(
        bash_completes_line(&script, "stop w", &nowhere),
        Vec::<String>::new()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The `PATH` that finds this build's fleetctl first, as a shell would find it by name.
fn path_with_fleetctl() -> String {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_fleetctl"));
    let dir = bin.parent().expect("fleetctl's directory").display();
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

/// What fish completes for `fleetctl <line>` (the cursor at its end), with fleetctl's fish
/// script loaded and run in `cwd`: fish's own `complete -C`, one candidate a line (its
/// description after a tab left off).
fn fish_completes(script: &std::path::Path, cwd: &std::path::Path, line: &str) -> Vec<String> {
    let probe = format!("source {}; complete -C'fleetctl {line}'", script.display());
    let out = Command::new("fish")
        .args(["--no-config", "-c", &probe])
        .current_dir(cwd)
        .env("PATH", path_with_fleetctl())
        .output()
        .expect("fish runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect()
}

/// Fish completes unit names and machine IDs from the cluster the line reaches, as bash does.
#[tokio::test]
async fn fish_completes_unit_names_and_machine_ids_from_the_cluster() {
    let dir = std::env::temp_dir().join(format!("fleetctl-completion-fish-{}", std::process::id()));
    let etcd = cluster_with_names(&dir).await;
    let out = fleetctl(&["completion", "fish"]);
    assert!(out.status.success(), "{out:?}");
    let script = dir.join("fleetctl.fish");
    std::fs::write(&script, &out.stdout).unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let endpoint = etcd.endpoint();
    let globals = format!("--driver etcd --endpoint {endpoint}");

    let units = fish_completes(&script, &empty, &format!("{globals} stop w"));
    assert_eq!(units, ["web.service", "worker.service"]);
    let machines = fish_completes(&script, &empty, &format!("{globals} set-metadata 4f"));
    assert_eq!(machines, ["4f1e2a10aaaa"]);
    let after = fish_completes(
        &script,
        &empty,
        &format!("{globals} set-metadata 4f1e2a10aaaa "),
    );
    assert_eq!(after, Vec::<String>::new());
    let flag = fish_completes(
        &script,
        &empty,
        &format!("{globals} stop --block-attempts "),
    );
    assert_eq!(flag, Vec::<String>::new());
    let equals = fish_completes(
        &script,
        &empty,
        &format!("cat --driver=etcd --endpoint={endpoint} d"),
    );
    assert_eq!(equals, ["db.service"]);
    // Commands still complete as clap's script completes them.
    let commands = fish_completes(&script, &empty, "list-u");
    assert_eq!(commands, ["list-units", "list-unit-files"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What an interactive zsh shows after `fleetctl <line>` and a TAB, with fleetctl's zsh script
/// installed as `_fleetctl` in its `fpath` and compinit run, as a user's shell has it: driven
/// through zsh's own pseudo-terminal module, read until `expect` shows (or 10 s). `first`, if
/// not empty, is completed first and erased (Ctrl-U): the completion under test is then zsh's
/// second, after the autoloaded file has replaced its own function.
fn zsh_completes(fpath: &std::path::Path, first: &str, line: &str, expect: &str) -> String {
    let probe = format!(
        r#"zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z 'PS1="%% "; fpath=({fpath} $fpath); autoload -Uz compinit; compinit -u -D'
[[ -n '{first}' ]] && zpty -n -w z $'fleetctl {first}\t\x15'
zpty -n -w z $'fleetctl {line}\t'
all=""
for i in {{1..100}}; do
    while zpty -rt z chunk; do all+=$chunk; done
    [[ $all == *'{expect}'* ]] && break
    sleep 0.1
done
zpty -d z
print -r -- "$all""#,
        fpath = fpath.display()
    );
    let out = Command::new("zsh")
        .args(["-f", "-c", &probe])
        .current_dir(fpath)
        .env("PATH", path_with_fleetctl())
        .output()
        .expect("zsh runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Zsh completes unit names and machine IDs from the cluster, and keeps doing so after its
/// first completion (clap's function is wrapped under the name zsh autoloads).
#[tokio::test]
async fn zsh_completes_unit_names_and_machine_ids_from_the_cluster() {
    let dir = std::env::temp_dir().join(format!("fleetctl-completion-zsh-{}", std::process::id()));
    let etcd = cluster_with_names(&dir).await;
    let fpath = dir.join("fpath");
    std::fs::create_dir_all(&fpath).unwrap();
    let out = fleetctl(&["completion", "zsh"]);
    assert!(out.status.success(), "{out:?}");
    std::fs::write(fpath.join("_fleetctl"), &out.stdout).unwrap();
    let endpoint = etcd.endpoint();
    let globals = format!("--driver etcd --endpoint {endpoint}");

    let shown = zsh_completes(
        &fpath,
        "list-unit-f",
        &format!("{globals} stop "),
        "worker.service",
    );
    for unit in ["web.service", "worker.service", "db.service"] {
        assert!(shown.contains(unit), "{unit} not offered:\n{shown}");
    }
    let shown = zsh_completes(
        &fpath,
        "",
        &format!("{globals} set-metadata 4"),
        "4f1e2a10aaaa",
    );
    assert!(shown.contains("4f1e2a10aaaa"), "{shown}");
    let shown = zsh_completes(&fpath, "", "list-unit-f", "list-unit-files");
    assert!(shown.contains("list-unit-files"), "{shown}");
    std::fs::remove_dir_all(&dir).unwrap();
}
