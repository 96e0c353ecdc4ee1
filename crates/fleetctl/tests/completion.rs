//! The completion scripts load in the shells they are for, and complete fleetctl's commands;
//! the man pages are written. No cluster is needed.

use std::process::Command;

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
