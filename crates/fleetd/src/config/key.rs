//! What a row of [`KEYS`](super::KEYS) is: a key's name (which gives its flag, variable and
//! file line), what it is when no layer gives it, its help line, and its setter. The
//! setters write into [`Parsed`]; the checks across keys run after every key is read
//! (`super::resolve`). Holds no key of its own: the table does.

use clap::Arg;
use fleet_registry::input::shorten;

use super::{Config, Raw, api, etcd_auth};

/// What the rows' setters write: the configuration, and the parts that only make sense
/// together (the API's TLS files and roles, etcd's user and password), which `resolve`
/// combines once every key is read. No `Debug`: it holds the etcd password.
#[derive(Default)]
pub struct Parsed {
    pub config: Config,
    pub api: api::Parts,
    pub etcd_auth: etcd_auth::Parts,
}

/// Parses, checks and stores a key's value; the error says why it is refused.
pub type Setter = fn(&mut Parsed, &str) -> Result<(), String>;

/// What a key is when no layer gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unset {
    /// This value, checked as if given (source "default"), shown by `--help` and the sample.
    Value(&'static str),
    /// Nothing: the setter is not called, and the configuration keeps its blank, which
    /// stands for what this text says (`2 x agent_ttl`); shown by `--help` and the sample.
    Derived(&'static str),
    /// Nothing, and nothing said.
    Nothing,
}

/// One configuration key: `agent_ttl` is the flag `--agent-ttl`, the variable
/// `FLEET_AGENT_TTL` and the file line `agent_ttl=...`.
#[derive(Debug)]
pub struct Key {
    pub name: &'static str,
    pub unset: Unset,
    pub help: &'static str,
    pub kind: Kind,
    /// Whether a refusal quotes the value (not for lists of subjects, whose entry is named).
    quotes: bool,
}

#[derive(Debug)]
pub enum Kind {
    /// Takes a value: `--agent-ttl 3s`.
    Value(Setter),
    /// A boolean whose flag alone means true: `--disable-engine`.
    Switch(Setter),
    /// A value `--help` must not show from the environment: etcd's user and password.
    Secret(Setter),
    /// fleet has it; fleetd accepts it, does nothing with it and warns.
    Ignored,
}

impl Key {
    pub const fn value(name: &'static str, unset: Unset, help: &'static str, set: Setter) -> Self {
        Self {
            name,
            unset,
            help,
            kind: Kind::Value(set),
            quotes: true,
        }
    }

    pub const fn switch(name: &'static str, help: &'static str, set: Setter) -> Self {
        Self {
            name,
            unset: Unset::Value("false"),
            help,
            kind: Kind::Switch(set),
            quotes: true,
        }
    }

    /// A value whose refusal names the key and the entry, not the whole list.
    pub const fn subjects(name: &'static str, help: &'static str, set: Setter) -> Self {
        Self {
            name,
            unset: Unset::Nothing,
            help,
            kind: Kind::Value(set),
            quotes: false,
        }
    }

    pub const fn secret(name: &'static str, help: &'static str, set: Setter) -> Self {
        Self {
            name,
            unset: Unset::Nothing,
            help,
            kind: Kind::Secret(set),
            quotes: true,
        }
    }

    pub const fn ignored(name: &'static str) -> Self {
        Self {
            name,
            unset: Unset::Nothing,
            help: "accepted as fleet does, and ignored",
            kind: Kind::Ignored,
            quotes: true,
        }
    }

    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    pub fn env(&self) -> String {
        format!("FLEET_{}", self.name.to_ascii_uppercase())
    }

    /// The help line with the default, as `--help` shows it.
    pub fn help_with_default(&self) -> String {
        match self.unset {
            Unset::Value(d) | Unset::Derived(d) => format!("{} [default: {d}]", self.help),
            Unset::Nothing => self.help.to_owned(),
        }
    }

    pub fn arg(&self) -> Arg {
        let arg = Arg::new(self.name)
            .long(self.flag())
            .env(self.env())
            .value_name("VALUE")
            .help(self.help_with_default());
        match self.kind {
            Kind::Value(_) => arg,
            // `--help` would show a password given in the environment.
            Kind::Secret(_) => arg.hide_env_values(true),
            Kind::Switch(_) => arg.num_args(0..=1).default_missing_value("true"),
            Kind::Ignored => arg.hide(true),
        }
    }

    /// The error for `r`, refused by this key's setter for `why`.
    pub fn refusal(&self, r: &Raw, why: &str) -> anyhow::Error {
        if self.quotes {
            invalid(self.name, r, why)
        } else {
            anyhow::anyhow!("invalid {} ({}): {why}", self.name, r.source)
        }
    }
}

pub fn invalid(key: &str, r: &Raw, why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "invalid {key} {:?} ({}): {why}",
        shorten(&r.value),
        r.source
    )
}
