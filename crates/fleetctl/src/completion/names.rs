//! Unit names and machine IDs in completion, for bash, zsh and fish (kubectl completes
//! names; fleet's fleetctl completed only files). clap's script completes commands, flags and
//! their values; this wraps it, and where a command takes units or machines of the cluster it asks the cluster
//! with fleetctl's own listings (`list-unit-files --fields unit`, `list-machines --fields
//! machine`), reached as the line being completed would reach it: the `FLEETCTL_*` variables
//! and the global flags typed on it. A cluster that does not answer (within 2 s unless
//! `FLEETCTL_REQUEST_TIMEOUT` says otherwise) adds no names and prints nothing.
//!
//! The shell code is in `names.{bash,zsh,fish}`, each filled with the command line's own
//! flags and commands, so that it cannot drift from them.

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

/// The flags of the command line, as the scripts below need them to find the command word
/// and the arguments after it, and what they pass on to the listings.
struct Flags {
    /// Every flag that takes its value as the next word.
    valued: Vec<String>,
    /// Of those, the global ones (they reach the cluster).
    globals: Vec<String>,
}

impl Flags {
    fn of(cmd: &clap::Command) -> Self {
        let (mut valued, mut globals) = (Vec::new(), Vec::new());
        collect_valued(cmd, &mut valued, &mut globals);
        for list in [&mut valued, &mut globals] {
            list.sort();
            list.dedup();
        }
        Self { valued, globals }
    }

    /// `template` with its placeholders filled: each list joined by `sep`, each item made a
    /// pattern by `quote`.
    fn fill(&self, template: &str, sep: &str, quote: fn(&str) -> String) -> String {
        let join = |items: Vec<String>| -> String {
            let quoted: Vec<String> = items.iter().map(|i| quote(i)).collect();
            quoted.join(sep)
        };
        let names = |list: &[&str]| join(list.iter().map(|s| (*s).to_owned()).collect());
        let with_equals = self.globals.iter().map(|g| format!("{g}=*")).collect();
        template
            .replace("@GLOBAL@", &join(self.globals.clone()))
            .replace("@GLOBAL_EQ@", &join(with_equals))
            .replace("@VALUED@", &join(self.valued.clone()))
            .replace("@UNITS@", &names(&UNIT_COMMANDS))
            .replace("@FILES@", &names(&FILE_COMMANDS))
            .replace("@MACHINES@", &names(&MACHINE_COMMANDS))
    }
}

/// As it is: flags and command names are plain words, and `*` is a pattern's.
fn bare(word: &str) -> String {
    word.to_owned()
}

/// Fish's `switch` and `contains` take quoted words; `*` still matches inside `case`.
fn fish_quoted(word: &str) -> String {
    format!("'{word}'")
}

/// The bash that wraps clap's `_fleetctl` (`cmd`: the command line clap's script was made from).
pub fn bash(cmd: &clap::Command) -> String {
    format!("\n{}", Flags::of(cmd).fill(BASH, "|", bare))
}

/// clap's zsh `script` with unit names and machine IDs: its `_fleetctl` renamed
/// `_fleetctl_clap` and wrapped by ours, put before the lines that register it. `None` when
/// clap's script no longer has the shape this relies on (a test says so).
pub fn zsh(cmd: &clap::Command, script: &str) -> Option<String> {
    const CLAP_FN: &str = "\n_fleetctl() {\n";
    const REGISTER: &str = "\nif [ \"$funcstack[1]\" = \"_fleetctl\" ]; then";
    let at = script.rfind(REGISTER)?;
    let (functions, register) = script.split_at(at);
    if functions.matches(CLAP_FN).count() != 1 {
        return None;
    }
    let functions = functions.replacen(CLAP_FN, "\n_fleetctl_clap() {\n", 1);
    let ours = Flags::of(cmd).fill(ZSH, "|", bare);
    Some(format!("{functions}\n{ours}{register}"))
}

/// The fish that adds unit names and machine IDs to clap's completions.
pub fn fish(cmd: &clap::Command) -> String {
    Flags::of(cmd).fill(FISH, " ", fish_quoted)
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

const BASH: &str = include_str!("names.bash");
const ZSH: &str = include_str!("names.zsh");
const FISH: &str = include_str!("names.fish");

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
