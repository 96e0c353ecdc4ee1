//! The command line's help: each command lists its own flags and describes every argument,
//! the global flags are listed once (`fleetctl --help`) and taken everywhere (issue 38).

use super::*;
use crate::driver::Driver;

/// Every command, subcommands of subcommands too, with its path (`auth setup`).
fn every_command(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
    for sub in cmd.get_subcommands() {
        let name = format!("{path} {}", sub.get_name()).trim().to_owned();
        out.push((name.clone(), sub.clone()));
        every_command(sub, &name, out);
    }
}

/// fleetctl's commands, as built (clap's own `help` commands left out).
fn commands() -> Vec<(String, clap::Command)> {
    let mut cmd = command();
    cmd.build();
    let mut all = Vec::new();
    every_command(&cmd, "", &mut all);
    all.retain(|(path, _)| !path.split(' ').any(|w| w == "help"));
    all
}

#[test]
fn a_commands_help_lists_its_own_flags_and_leaves_the_global_ones_to_fleetctl_help() {
    for (name, mut sub) in commands() {
        let help = sub.render_long_help().to_string();
        for global in [
            "--endpoint",
            "--etcd-key-prefix",
            "--known-hosts-file",
            "--debug",
        ] {
            let listed = help.lines().any(|l| l.trim_start().starts_with(global));
            assert!(!listed, "{name} --help lists {global}:\n{help}");
        }
        assert!(help.contains(GLOBALS_NOTE), "{name}:\n{help}");
    }
    let mut top = command();
    let help = top.render_long_help().to_string();
    assert!(help.contains("Global options:"), "{help}");
    assert!(help.contains("--endpoint"), "{help}");
    let start = commands()
        .into_iter()
        .find(|(n, _)| n == "start")
        .map(|(_, mut c)| c.render_long_help().to_string())
        .expect("start");
    assert!(start.lines().count() < 40, "{start}");
}

#[test]
fn global_flags_are_taken_before_and_after_any_command() {
    for args in [
        &["fleetctl", "--driver", "etcd", "list-units", "--no-legend"][..],
        &["fleetctl", "list-units", "--driver", "etcd", "--no-legend"],
        &["fleetctl", "auth", "list", "--driver=etcd"],
        &["fleetctl", "start", "--no-block", "x", "--driver", "etcd"],
    ] {
        let matches = command().try_get_matches_from(args).expect("parses");
        let cli = Cli::from_arg_matches(&matches).expect("a command line");
        assert_eq!(cli.global.driver, Some(Driver::Etcd), "{args:?}");
    }
}

#[test]
fn every_argument_of_every_command_is_described() {
    for (name, sub) in commands() {
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
            assert!(
                arg.get_help().is_some() || arg.get_long_help().is_some(),
                "{name}: {} has no description",
                arg.get_id()
            );
        }
    }
}

#[test]
fn the_driver_is_one_of_its_values_and_help_says_which() {
    let e = command()
        .try_get_matches_from(["fleetctl", "--driver", "http", "list-units"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("[possible values: api, etcd]"), "{e}");
}
