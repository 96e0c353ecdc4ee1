//! Unit names and machine IDs in bash completion (issue 38: kubectl completes names, fleetctl
//! completed only files). clap's script completes commands, flags and their values; this
//! wraps it, and where a command takes units or machines of the cluster it asks the cluster
//! with fleetctl's own listings (`list-unit-files --fields unit`, `list-machines --fields
//! machine`), reached as the line being completed would reach it: the `FLEETCTL_*` variables
//! and the global flags typed on it. A cluster that does not answer (within 2 s unless
//! `FLEETCTL_REQUEST_TIMEOUT` says otherwise) adds no names and prints nothing.
//!
//! Only bash: zsh and fish get clap's scripts as they are.

use clap::Arg;

/// Commands whose arguments are units of the cluster.
pub const UNIT_COMMANDS: [&str; 10] = [
    "load", "start", "stop", "unload", "restart", "status", "journal", "cat", "destroy", "explain",
];

/// Of those, the ones that also take local unit files.
pub const FILE_COMMANDS: [&str; 2] = ["load", "start"];

/// Commands whose first argument is a machine (`ssh`'s a machine or a unit).
pub const MACHINE_COMMANDS: [&str; 5] =
    ["drain", "undrain", "set-metadata", "unset-metadata", "ssh"];

/// The bash that wraps clap's `_fleetctl` (`cmd`: the command line clap's script was made from).
pub fn bash(cmd: &clap::Command) -> String {
    let mut valued = Vec::new();
    let mut globals = Vec::new();
    collect_valued(cmd, &mut valued, &mut globals);
    valued.sort();
    valued.dedup();
    globals.sort();
    globals.dedup();
    let with_equals: Vec<String> = globals.iter().map(|g| format!("{g}=*")).collect();
    BASH.replace("@GLOBAL@", &globals.join("|"))
        .replace("@GLOBAL_EQ@", &with_equals.join("|"))
        .replace("@VALUED@", &valued.join("|"))
        .replace("@UNITS@", &UNIT_COMMANDS.join("|"))
        .replace("@FILES@", &FILE_COMMANDS.join("|"))
        .replace("@MACHINES@", &MACHINE_COMMANDS.join("|"))
}

/// Every flag of `cmd` and its commands that takes its value as the next word, and of those
/// the global ones: how the script finds the command word and what it passes on.
fn collect_valued(cmd: &clap::Command, valued: &mut Vec<String>, globals: &mut Vec<String>) {
    for arg in cmd.get_arguments().filter(|a| takes_next_word(a)) {
        let longs = arg.get_long_and_visible_aliases().into_iter().flatten();
        let spellings: Vec<String> = longs
            .map(|l| format!("--{l}"))
            .chain(arg.get_short().map(|s| format!("-{s}")))
            .collect();
        if arg.is_global_set() {
            globals.extend(spellings.iter().cloned());
        }
        valued.extend(spellings);
    }
    for sub in cmd.get_subcommands() {
        collect_valued(sub, valued, globals);
    }
}

/// A flag whose value may be the next word (not `--rolling[=N]`, which needs `=`).
fn takes_next_word(arg: &Arg) -> bool {
    !arg.is_positional() && arg.get_action().takes_values() && !arg.is_require_equals_set()
}

const BASH: &str = r#"
# Unit names and machine IDs from the cluster, as this line would reach it (fleetctl's
# completion.rs, issue 38). Wraps clap's _fleetctl above.
_fleetctl_with_names() {
    local cur="$2" prev="$3"
    _fleetctl "$@"
    [[ "$cur" == -* ]] && return 0
    case "$prev" in
        @VALUED@) return 0 ;;
    esac
    local words=()
    read -ra words <<< "${COMP_LINE:0:COMP_POINT}"
    # The word being completed is no argument yet.
    [[ -n "$cur" ]] && unset 'words[${#words[@]}-1]'
    local globals=() sub="" args=0 i word
    for (( i = 1; i < ${#words[@]}; i++ )); do
        word="${words[i]}"
        case "$word" in
            @GLOBAL@) globals+=("$word" "${words[i+1]}"); i=$((i + 1)) ;;
            @GLOBAL_EQ@) globals+=("$word") ;;
            @VALUED@) i=$((i + 1)) ;;
            -*) ;;
            *) if [[ -z "$sub" ]]; then sub="$word"; else args=$((args + 1)); fi ;;
        esac
    done
    local ask=()
    case "$sub" in
        @MACHINES@) (( args == 0 )) && ask+=(machines) ;;
    esac
    case "$sub" in
        @UNITS@) ask+=(units) ;;
        ssh) (( args == 0 )) && ask+=(units) ;;
    esac
    local kind names
    for kind in "${ask[@]}"; do
        case "$kind" in
            units) names=$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "$1" "${globals[@]}" list-unit-files --no-legend --fields unit 2>/dev/null) ;;
            machines) names=$(FLEETCTL_REQUEST_TIMEOUT="${FLEETCTL_REQUEST_TIMEOUT:-2}" "$1" "${globals[@]}" list-machines --no-legend --full --fields machine 2>/dev/null) ;;
        esac
        COMPREPLY+=( $(compgen -W "$names" -- "$cur") )
    done
    case "$sub" in
        @FILES@) COMPREPLY+=( $(compgen -f -- "$cur") ) ;;
    esac
    return 0
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _fleetctl_with_names -o nosort -o bashdefault -o default fleetctl
else
    complete -F _fleetctl_with_names -o bashdefault -o default fleetctl
fi
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn command() -> clap::Command {
        let mut cmd = crate::cli::Cli::command();
        cmd.build();
        cmd
    }

    fn positional_names(sub: &clap::Command) -> Vec<String> {
        sub.get_positionals()
            .filter_map(|a| a.get_value_names().map(|n| n.join(" ")))
            .collect()
    }

    /// The lists stay true to the command line: every command named exists, and every
    /// command whose arguments are units or machines is named (but `submit`, which takes
    /// new files).
    #[test]
    fn the_commands_completed_with_names_are_those_whose_arguments_are_names() {
        let cmd = command();
        for name in UNIT_COMMANDS.iter().chain(&MACHINE_COMMANDS) {
            assert!(cmd.find_subcommand(name).is_some(), "{name}");
        }
        for sub in cmd.get_subcommands() {
            let name = sub.get_name();
            let positionals = positional_names(sub);
            let first = positionals.first().map(String::as_str);
            let units = first == Some("UNIT") && name != "submit";
            assert_eq!(
                UNIT_COMMANDS.contains(&name),
                units,
                "{name}: {positionals:?}"
            );
            let machines = matches!(first, Some("MACHINE" | "MACHINE|UNIT [COMMAND]"));
            assert_eq!(
                MACHINE_COMMANDS.contains(&name),
                machines,
                "{name}: {positionals:?}"
            );
        }
    }

    #[test]
    fn the_flags_that_take_the_next_word_are_known_with_the_global_ones_apart() {
        let script = bash(&command());
        let global = script
            .lines()
            .find(|l| l.contains(r#"globals+=("$word" "${words[i+1]}")"#))
            .expect("the global flags' case");
        assert!(global.contains("--endpoint|"), "{global}");
        assert!(global.contains("|--driver|"), "{global}");
        assert!(!global.contains("--block-attempts"), "{global}");
        assert!(
            !global.contains("--debug"),
            "a flag without a value: {global}"
        );
        let valued = script
            .lines()
            .find(|l| l.trim_end().ends_with(") i=$((i + 1)) ;;"))
            .expect("every valued flag's case");
        assert!(valued.contains("--block-attempts|"), "{valued}");
        assert!(valued.contains("|--ssh-port|"), "{valued}");
        assert!(
            !valued.contains("--rolling"),
            "--rolling takes =N only: {valued}"
        );
        for placeholder in ["@GLOBAL", "@VALUED@", "@UNITS@", "@FILES@", "@MACHINES@"] {
            assert!(
                !script.contains(placeholder),
                "{placeholder} left: {script}"
            );
        }
    }
}
