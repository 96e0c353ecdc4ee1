//! Reading unit states in batches and per-unit properties.

use super::{SystemdManager, bus_error};
use crate::manager::{MainExit, ManagerError, ReloadFacts, UnitDetails, UnitFacts};
use fleet_core::{SystemdState, UnitName, UnitType};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use zbus::proxy::CacheProperties;
use zbus_systemd::systemd1::{ServiceProxy, UnitProxy};

/// The object path of `name`'s unit; systemd loads the unit on demand when it is asked.
pub(super) fn unit_path(name: &UnitName) -> zbus::OwnedObjectPath {
    zbus_systemd::bus_path_encode(
        &zbus::ObjectPath::from_static_str_unchecked("/org/freedesktop/systemd1/unit"),
        name.as_str(),
    )
}

impl SystemdManager {
    pub(super) async fn status_batch(
        &self,
        names: &[UnitName],
        out: &mut BTreeMap<UnitName, SystemdState>,
    ) -> Result<(), ManagerError> {
        // systemd refuses a whole batch over one name it considers invalid; such a unit cannot
        // exist in systemd, so it is not-found without asking.
        let (asked, refused): (Vec<&UnitName>, Vec<&UnitName>) =
            names.iter().partition(|n| systemd_accepts(n));
        for name in refused {
            out.insert(name.clone(), SystemdState::not_found());
        }
        if asked.is_empty() {
            return Ok(());
        }
        let request = asked.iter().map(|n| n.to_string()).collect();
        let reply = {
            let _permit = self.permit().await;
            self.inner.manager.list_units_by_names(request).await
        };
        let reply = reply.map_err(|e| ManagerError::Status {
            count: asked.len(),
            source: bus_error(e),
        })?;
        // One entry per name, in order; an alias comes back under its unit's own name, so the
        // position, not the returned name, says which unit was asked for.
        if reply.len() == asked.len() {
            for (name, entry) in asked.into_iter().zip(reply) {
                let (_, _, load, active, sub, ..) = entry;
                out.insert(name.clone(), SystemdState { load, active, sub });
            }
        } else {
            for (id, _, load, active, sub, ..) in reply {
                if let Ok(name) = id.parse::<UnitName>() {
                    out.insert(name, SystemdState { load, active, sub });
                }
            }
            for name in asked {
                out.entry(name.clone())
                    .or_insert_with(SystemdState::not_found);
            }
        }
        Ok(())
    }

    /// The file systemd loaded `name` from (`FragmentPath`); `None` when it found none.
    pub(super) async fn read_fragment(&self, name: &UnitName) -> zbus::Result<Option<PathBuf>> {
        let _permit = self.permit().await;
        let unit = self.unit_proxy(name).await?;
        let fragment = unit.fragment_path().await?;
        Ok(Some(PathBuf::from(fragment)).filter(|p| !p.as_os_str().is_empty()))
    }

    async fn unit_proxy(&self, name: &UnitName) -> zbus::Result<UnitProxy<'static>> {
        UnitProxy::builder(&self.inner.conn)
            .path(unit_path(name))
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    /// Which of `names` systemd holds, from one `ListUnitsByPatterns` call (it lists units in
    /// memory and loads none; `ListUnitsByNames` and property reads load each unit they name).
    /// A name that is not an exact pattern is answered as held (the caller then asks it).
    /// Patterns match units' own names, not aliases: a fleet unit whose name another unit
    /// holds as an alias (an operator's `Alias=`) is answered as not held.
    pub(super) async fn list_loaded(
        &self,
        names: &[UnitName],
    ) -> Result<BTreeSet<UnitName>, ManagerError> {
        let (exact, inexact): (Vec<&UnitName>, Vec<&UnitName>) =
            names.iter().partition(|n| pattern_is_exact(n));
        let mut held: BTreeSet<UnitName> = inexact.into_iter().cloned().collect();
        if exact.is_empty() {
            return Ok(held);
        }
        let patterns = exact.iter().map(|n| n.to_string()).collect();
        let reply = {
            let _permit = self.permit().await;
            self.inner
                .manager
                .list_units_by_patterns(Vec::new(), patterns)
                .await
        };
        let reply = reply.map_err(|e| ManagerError::Status {
            count: exact.len(),
            source: bus_error(e),
        })?;
        let asked: BTreeSet<&UnitName> = exact.into_iter().collect();
        for (id, ..) in reply {
            if let Ok(name) = id.parse::<UnitName>()
                && asked.contains(&name)
            {
                held.insert(name);
            }
        }
        Ok(held)
    }

    pub(super) async fn read_reload_facts(&self, name: &UnitName) -> zbus::Result<ReloadFacts> {
        let _permit = self.permit().await;
        let unit = self.unit_proxy(name).await?;
        let drop_ins = unit.drop_in_paths().await?;
        Ok(ReloadFacts {
            drop_in_paths: drop_ins.into_iter().map(PathBuf::from).collect(),
            need_daemon_reload: unit.need_daemon_reload().await?,
        })
    }

    /// One property read, under one permit.
    pub(super) async fn read_since(&self, name: &UnitName) -> zbus::Result<Option<u64>> {
        let _permit = self.permit().await;
        let unit = self.unit_proxy(name).await?;
        Ok(Some(unit.state_change_timestamp().await?).filter(|t| *t != 0))
    }

    /// Five property reads for a service (one for other types), under one permit.
    pub(super) async fn read_facts(&self, name: &UnitName) -> zbus::Result<UnitFacts> {
        let _permit = self.permit().await;
        let unit = self.unit_proxy(name).await?;
        let since = Some(unit.state_change_timestamp().await?).filter(|t| *t != 0);
        let mut facts = UnitFacts {
            since,
            ..UnitFacts::default()
        };
        if name.unit_type() == UnitType::Service {
            let service = ServiceProxy::builder(&self.inner.conn)
                .path(unit_path(name))
                .cache_properties(CacheProperties::No)
                .build()
                .await?;
            facts.n_restarts = service.n_restarts().await?;
            facts.result = Some(service.result().await?);
            let code = service.exec_main_code().await?;
            facts.main_exit = MainExit::from_code(code, service.exec_main_status().await?);
        }
        Ok(facts)
    }

    pub(super) async fn read_details(&self, name: &UnitName) -> zbus::Result<UnitDetails> {
        let path = unit_path(name);
        let _permit = self.permit().await;
        let unit = self.unit_proxy(name).await?;
        let state = SystemdState {
            load: unit.load_state().await?,
            active: unit.active_state().await?,
            sub: unit.sub_state().await?,
        };
        let fragment = unit.fragment_path().await?;
        let drop_ins = unit.drop_in_paths().await?;
        let need_daemon_reload = unit.need_daemon_reload().await?;
        let invocation = unit.invocation_id().await?;
        // Only services have a main process (the Service interface).
        let (mut main_pid, mut result, mut main_exit) = (None, None, None);
        if name.unit_type() == UnitType::Service {
            let service = ServiceProxy::builder(&self.inner.conn)
                .path(path)
                .cache_properties(CacheProperties::No)
                .build()
                .await?;
            main_pid = Some(service.main_pid().await?).filter(|pid| *pid != 0);
            result = Some(service.result().await?);
            let code = service.exec_main_code().await?;
            main_exit = MainExit::from_code(code, service.exec_main_status().await?);
        }
        Ok(UnitDetails {
            state,
            fragment_path: Some(PathBuf::from(fragment)).filter(|p| !p.as_os_str().is_empty()),
            drop_in_paths: drop_ins.into_iter().map(PathBuf::from).collect(),
            need_daemon_reload,
            main_pid,
            invocation_id: Some(hex(&invocation)).filter(|id| !id.is_empty()),
            result,
            main_exit,
        })
    }
}

/// systemd's own unit name rules (`unit_name_is_valid`): fleet allows one byte more.
/// Whether `name` as a `ListUnitsByPatterns` pattern matches that unit alone: systemd matches
/// patterns with `fnmatch`, where a `\\` escapes the next character.
fn pattern_is_exact(name: &UnitName) -> bool {
    !name.as_str().contains(['\\', '*', '?', '['])
}

fn systemd_accepts(name: &UnitName) -> bool {
    let s = name.as_str();
    s.len() < 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> UnitName {
        s.parse().unwrap()
    }

    #[test]
    fn asks_systemd_only_about_names_it_accepts() {
        assert!(systemd_accepts(&name("web@1.service")));
        assert!(systemd_accepts(&name("a-b_c:d.mount")));
        let longest = format!("{}.service", "a".repeat(255 - ".service".len()));
        assert!(systemd_accepts(&name(&longest)));
        let too_long = format!("{}.service", "a".repeat(256 - ".service".len()));
        assert!(!systemd_accepts(&name(&too_long)));
    }

    #[test]
    fn formats_invocation_ids_as_hex() {
        assert_eq!(hex(&[0x0a, 0xff, 0x10]), "0aff10");
        assert_eq!(hex(&[]), "");
    }
}
