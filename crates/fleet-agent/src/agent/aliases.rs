//! `[Install] Alias=` of fleet's units (issue 37, item 9). Enabling a unit links each of its
//! aliases into `/run/systemd/system`, which comes before `/etc` and `/lib` in systemd's
//! search path, and `EnableUnitFiles(runtime, force)` replaces what is there: a fleet unit
//! with `Alias=ssh.service` would stand in for the host's sshd, and one aliased to a unit of
//! `deny_units` would escape that list. So a unit is held (never loaded, linked or started)
//! while an alias of it names a denied unit, a unit systemd has from a file outside fleet's
//! units directory (an operator's), or another of fleet's units, or is no unit name at all.
//! Checked once per unit file (its hash): an alias fleet linked itself resolves to fleet's
//! own directory afterwards, which is no reason to refuse.
//!
//! `[Install] Also=` enables other units with this one, so a unit of `deny_units` or an
//! operator's unit named there would be enabled (started at the next boot) by fleet's unit:
//! it is held likewise. Another of fleet's units or a new name in `Also=` is fine.
//!
//! The policy is pure ([`refusal`]); the agent's check ([`Agent::aliased`]) asks systemd where
//! each alias comes from and holds what the policy refuses.

use fleet_core::{UnitFile, UnitName};
use fleet_registry::kv::Kv;
use tracing::warn;

use super::Agent;
use crate::desired::Desired;
use crate::manager::{UnitManager, UnitSource};

/// An `[Install]` directive that names other units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// `Alias=`: a name linked to this unit.
    Alias,
    /// `Also=`: a unit enabled with this one.
    Also,
}

impl Directive {
    fn key(self) -> &'static str {
        match self {
            Directive::Alias => "Alias",
            Directive::Also => "Also",
        }
    }
}

/// The names a unit file's `[Install]` section asks for: every word of every `Alias=` line,
/// then of every `Also=` line.
pub fn aliases(file: &UnitFile) -> Vec<(Directive, String)> {
    [Directive::Alias, Directive::Also]
        .into_iter()
        .flat_map(|d| {
            file.values("Install", d.key())
                .flat_map(str::split_whitespace)
                .map(move |w| (d, w.to_owned()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What is known of one alias of a unit.
#[derive(Debug)]
pub struct Alias<'a> {
    pub directive: Directive,
    pub name: &'a str,
    /// Whether it matches `deny_units` (or the fence's prefix).
    pub denied: bool,
    /// Whether fleet has a unit of that name here (scheduled, or in its units directory).
    pub fleets: bool,
    /// Where systemd has a unit of that name from, if asked.
    pub source: Option<&'a UnitSource>,
}

/// Why `unit` may not have `alias`, if it may not.
pub fn refusal(unit: &UnitName, alias: &Alias<'_>) -> Option<String> {
    let name = alias.name;
    let key = alias.directive.key();
    if name.parse::<UnitName>().is_err() {
        return Some(format!("{key}={name} is no unit name"));
    }
    if name == unit.as_str() {
        return None;
    }
    if alias.denied {
        return Some(format!("{key}={name} names a unit of deny_units"));
    }
    if alias.fleets {
        return (alias.directive == Directive::Alias)
            .then(|| format!("{key}={name} names another of fleet's units"));
    }
    match alias.source {
        Some(UnitSource::Foreign { fragment }) => Some(format!(
            "{key}={name} names the host's unit from {}",
            fragment.display()
        )),
        Some(UnitSource::NoFile | UnitSource::UnitsDir) | None => None,
    }
}

impl<K: Kv, M: UnitManager> Agent<K, M> {
    /// Desired units whose file asks for an alias they may not have (`aliases`): held, and
    /// warned of once per file. An alias whose source cannot be read holds its unit this
    /// pass: fail closed.
    pub(super) async fn aliased(&mut self, desired: &Desired) -> Vec<UnitName> {
        let mut held = Vec::new();
        let mut unchecked = Vec::new();
        for (name, unit) in &desired.units {
            let Some(words) = self.schedule.files().get(&unit.hash).map(aliases) else {
                continue;
            };
            match self.alias_verdicts.get(name) {
                _ if words.is_empty() => {}
                Some((hash, verdict)) if *hash == unit.hash => {
                    if verdict.is_some() {
                        held.push(name.clone());
                    }
                }
                _ => unchecked.push((name.clone(), unit.hash, words)),
            }
        }
        for (name, hash, words) in unchecked {
            match self.alias_refusal(desired, &name, &words).await {
                Ok(verdict) => {
                    if let Some(why) = &verdict {
                        warn!(unit = %name, reason = %why, "refusing to manage unit: an alias it asks for is not its to take");
                        held.push(name.clone());
                    }
                    self.alias_verdicts.insert(name, (hash, verdict));
                }
                Err(e) => {
                    warn!(unit = %name, error = %e, "reading where systemd has a unit's alias from failed; leaving the unit as it is");
                    held.push(name);
                }
            }
        }
        held
    }

    /// Why `name` may not have the aliases `words`, if it may not.
    async fn alias_refusal(
        &self,
        desired: &Desired,
        name: &UnitName,
        words: &[(Directive, String)],
    ) -> Result<Option<String>, crate::ManagerError> {
        for (directive, word) in words {
            let parsed = word.parse::<UnitName>().ok();
            let source = match &parsed {
                Some(alias) if alias != name => Some(self.manager.source(alias).await?),
                _ => None,
            };
            let alias = Alias {
                directive: *directive,
                name: word,
                denied: parsed.as_ref().is_some_and(|a| self.is_denied(a)),
                fleets: parsed.as_ref().is_some_and(|a| {
                    desired.units.contains_key(a) || self.current.units.contains_key(a)
                }),
                source: source.as_ref(),
            };
            if let Some(why) = refusal(name, &alias) {
                return Ok(Some(why));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(name: &str) -> UnitName {
        name.parse().unwrap()
    }

    fn alias<'a>(name: &'a str, source: Option<&'a UnitSource>) -> Alias<'a> {
        Alias {
            directive: Directive::Alias,
            name,
            denied: false,
            fleets: false,
            source,
        }
    }

    #[test]
    fn every_word_of_every_alias_line_is_an_alias() {
        let file = UnitFile::parse(
            b"[Service]\nExecStart=/bin/true\n[Install]\nAlso=d.service\nAlias=a.service b.service\nAlias=c.service\nWantedBy=multi-user.target\n",
        )
        .unwrap();
        let alias = |w: &str| (Directive::Alias, w.to_owned());
        assert_eq!(
            aliases(&file),
            [
                alias("a.service"),
                alias("b.service"),
                alias("c.service"),
                (Directive::Also, "d.service".to_owned())
            ]
        );
    }

    #[test]
    fn an_alias_over_a_hosts_unit_a_denied_one_or_another_fleet_unit_is_refused() {
        let web = unit("web.service");
        let foreign = UnitSource::Foreign {
            fragment: "/lib/systemd/system/ssh.service".into(),
        };
        let why = refusal(&web, &alias("ssh.service", Some(&foreign))).unwrap();
        assert!(why.contains("the host's unit from /lib/systemd/system/ssh.service"));
        let denied = Alias {
            denied: true,
            ..alias("sshd.service", Some(&UnitSource::NoFile))
        };
        assert!(refusal(&web, &denied).unwrap().contains("deny_units"));
        let other = Alias {
            fleets: true,
            ..alias("db.service", Some(&UnitSource::UnitsDir))
        };
        assert!(
            refusal(&web, &other)
                .unwrap()
                .contains("another of fleet's")
        );
        assert!(refusal(&web, &alias("../x", None)).is_some());
    }

    #[test]
    fn a_new_name_or_one_fleet_linked_itself_is_fine() {
        let web = unit("web.service");
        assert_eq!(
            refusal(&web, &alias("www.service", Some(&UnitSource::NoFile))),
            None
        );
        assert_eq!(
            refusal(&web, &alias("www.service", Some(&UnitSource::UnitsDir))),
            None
        );
        assert_eq!(refusal(&web, &alias("web.service", None)), None);
    }

    /// Issue 37, item 9: `Also=` enables the units it names; a host's or a denied one is
    /// refused, another of fleet's units or a new name is fine.
    #[test]
    fn also_naming_a_hosts_unit_or_a_denied_one_is_refused_and_fleets_own_is_fine() {
        let web = unit("web.service");
        let also = |name, source, denied, fleets| Alias {
            directive: Directive::Also,
            denied,
            fleets,
            ..alias(name, source)
        };
        let foreign = UnitSource::Foreign {
            fragment: "/etc/systemd/system/vault.service".into(),
        };
        let why = refusal(&web, &also("vault.service", Some(&foreign), false, false)).unwrap();
        assert!(
            why.starts_with("Also=vault.service names the host's unit"),
            "{why}"
        );
        let why = refusal(&web, &also("ssh.service", None, true, false)).unwrap();
        assert!(why.contains("deny_units"), "{why}");
        let fleets = also("db.service", Some(&UnitSource::UnitsDir), false, true);
        assert_eq!(refusal(&web, &fleets), None);
        assert_eq!(
            refusal(
                &web,
                &also("new.service", Some(&UnitSource::NoFile), false, false)
            ),
            None
        );
    }
}
