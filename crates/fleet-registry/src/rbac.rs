//! Least privilege in etcd (issue 17): the etcd RBAC roles of the registry's role handles,
//! and the administration that creates them.
//!
//! Each role handle of this crate ([`UnitsRole`](crate::UnitsRole), [`MachineRole`](crate::MachineRole),
//! [`EngineRole`](crate::EngineRole)) writes only its own keys; this module states the same
//! thing as etcd permissions, so that etcd refuses what the code would never send. The key
//! layout makes every permission a prefix or one key (docs/registry.md, Roles).
//!
//! - [`viewer`]: reads everything under the prefix (fleetctl's listings, the API's GETs).
//! - [`operator`]: the viewer's reads, and writes units, files, file references, dynamic
//!   metadata, drain marks and user actions' events (`event/user/`); never a schedule, a
//!   state, a presence or the leader key.
//! - [`engine`]: reads everything, writes schedules, unscheduled reasons, `engine/` (the
//!   leader key, the disruption notice), moves, the placement history and its events
//!   (`event/engine/`).
//! - [`machine`] (one per machine ID `M`): writes `machine/M`, `unit-state/M/` and its agent's
//!   events `event/machine/M/`, reads `schedule/M/` and the unit files. Nothing else: a host's
//!   credentials cannot touch another machine's keys or events, a unit, or the leader key.
//!
//! Events (issue 41) are read by every role that reads everything (the viewer included).
//!
//! A host's etcd user holds [`host_roles`]: its machine role, plus the engine role on an
//! engine-capable host, plus the viewer or operator role when its API serves reads or writes.
//!
//! The plan is pure ([`RoleSpec::permits`] answers what a role may do to a key, the check the
//! fake RBAC of tests uses); [`Admin`] applies it to a real etcd as its root user.

use fleet_core::MachineId;

use crate::keys::{EventSource, Keys};
use std::sync::{Arc, PoisonError, RwLock};

use crate::kv::{EtcdAuth, EtcdConfig, EtcdKv, Grant, KvError};

/// The role of read-only users: every read, no write.
pub const ROLE_VIEWER: &str = "fleet-viewer";
/// The role of fleetctl's operators (and of fleetd hosts whose API takes writes).
pub const ROLE_OPERATOR: &str = "fleet-operator";
/// The role of engine-capable fleetd hosts.
pub const ROLE_ENGINE: &str = "fleet-engine";
/// etcd's own superuser role, which `auth enable` requires a `root` user to hold.
pub const ROLE_ROOT: &str = "root";

/// The etcd role of machine `m`: `fleet-machine-<m>`.
pub fn machine_role_name(m: &MachineId) -> String {
    format!("fleet-machine-{m}")
}

/// The etcd user issued to the fleetd of machine `m`: `fleet-host-<m>`.
pub fn host_user_name(m: &MachineId) -> String {
    format!("fleet-host-{m}")
}

/// What a permission allows, as etcd's `READ`, `WRITE`, `READWRITE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    /// Whether a permission of this kind covers an access of kind `wanted`.
    pub fn covers(self, wanted: Access) -> bool {
        match (self, wanted) {
            (Access::ReadWrite, _) => true,
            (a, b) => a == b,
        }
    }
}

/// One etcd permission: `key` alone, or every key starting with `key` when `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub access: Access,
    pub key: String,
    pub prefix: bool,
}

impl Permission {
    fn prefix(access: Access, key: String) -> Permission {
        Permission {
            access,
            key,
            prefix: true,
        }
    }

    fn key(access: Access, key: String) -> Permission {
        Permission {
            access,
            key,
            prefix: false,
        }
    }

    /// Whether this permission allows `wanted` on `key`.
    pub fn permits(&self, wanted: Access, key: &str) -> bool {
        self.access.covers(wanted)
            && if self.prefix {
                key.starts_with(&self.key)
            } else {
                key == self.key
            }
    }
}

/// An etcd role: its name and exactly its permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleSpec {
    pub name: String,
    pub permissions: Vec<Permission>,
}

impl RoleSpec {
    /// Whether the role allows `wanted` on `key` (a read of a prefix is allowed only when one
    /// permission covers the whole prefix, as etcd checks ranges).
    pub fn permits(&self, wanted: Access, key: &str) -> bool {
        self.permissions.iter().any(|p| p.permits(wanted, key))
    }
}

/// Every read under the prefix.
pub fn viewer(keys: &Keys) -> RoleSpec {
    RoleSpec {
        name: ROLE_VIEWER.to_owned(),
        permissions: vec![Permission::prefix(Access::Read, keys.prefix().to_owned())],
    }
}

/// The viewer's reads; writes of units, files, file references, dynamic metadata, drains,
/// and the events of user actions.
pub fn operator(keys: &Keys) -> RoleSpec {
    let mut permissions = viewer(keys).permissions;
    for prefix in [
        keys.units(),
        keys.files(),
        keys.all_file_refs(),
        keys.metadata_all(),
        keys.drains(),
        keys.source_events(&EventSource::User),
    ] {
        permissions.push(Permission::prefix(Access::ReadWrite, prefix));
    }
    RoleSpec {
        name: ROLE_OPERATOR.to_owned(),
        permissions,
    }
}

/// Every read; writes of schedules (and their mirror by unit, placements), unscheduled
/// reasons, `engine/` (leader, disruption), moves, the placement history (`left/`).
pub fn engine(keys: &Keys) -> RoleSpec {
    let mut permissions = viewer(keys).permissions;
    for prefix in [
        keys.schedules(),
        keys.placements(),
        keys.unscheduled_all(),
        format!("{}engine/", keys.prefix()),
        keys.moves(),
        keys.lefts(),
        keys.source_events(&EventSource::Engine),
    ] {
        permissions.push(Permission::prefix(Access::ReadWrite, prefix));
    }
    RoleSpec {
        name: ROLE_ENGINE.to_owned(),
        permissions,
    }
}

/// Machine `m`'s own keys: its presence and its unit states (read-write), its schedule and
/// the unit files (read), every machine's presence (read): the peers it asks whether
/// they reach etcd when it cannot (issue 36, `fleet_agent::witness`), and its migration mark
/// (read-write: it deletes it once it has taken over what fleet v1 ran there).
pub fn machine(keys: &Keys, m: &MachineId) -> RoleSpec {
    RoleSpec {
        name: machine_role_name(m),
        permissions: vec![
            Permission::key(Access::ReadWrite, keys.machine(m)),
            Permission::prefix(Access::Read, keys.machines()),
            Permission::prefix(Access::ReadWrite, keys.machine_states(m)),
            Permission::prefix(Access::Read, keys.machine_schedule(m)),
            Permission::prefix(Access::Read, keys.files()),
            Permission::key(Access::ReadWrite, keys.migrating(m)),
            Permission::prefix(
                Access::ReadWrite,
                keys.source_events(&EventSource::Machine(m.clone())),
            ),
        ],
    }
}

/// What a fleetd host's API may do in etcd on its clients' behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiGrant {
    /// The host's API cannot read or write the registry (its requests get 403).
    None,
    /// Viewer: the API serves reads.
    Read,
    /// Operator: the API serves reads and writes.
    Write,
}

/// The roles of one fleetd host's etcd user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGrant {
    pub machine: MachineId,
    /// An engine-capable host (`disable_engine` unset) gets [`engine`].
    pub engine: bool,
    pub api: ApiGrant,
}

/// The roles of a host's user, its machine role first.
pub fn host_roles(keys: &Keys, grant: &HostGrant) -> Vec<RoleSpec> {
    let mut roles = vec![machine(keys, &grant.machine)];
    if grant.engine {
        roles.push(engine(keys));
    }
    match grant.api {
        ApiGrant::None => {}
        ApiGrant::Read => roles.push(viewer(keys)),
        ApiGrant::Write => roles.push(operator(keys)),
    }
    roles
}

/// An etcd user as [`Admin::users`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub roles: Vec<String>,
}

/// etcd's user and role administration, done as etcd's `root` user (or anonymously on an
/// etcd whose auth is not enabled yet). Every call is idempotent: running a setup twice
/// changes nothing the second time. It reaches etcd as [`EtcdKv`] does (the same TLS,
/// credentials, members and failover); its errors are [`KvError`]s, a refusal naming what
/// was asked ("etcd user 'fleet-viewer' may not add role fleet-operator").
#[derive(Debug, Clone)]
pub struct Admin {
    cfg: EtcdConfig,
    /// Replaced by a client logged in as `root` once [`Admin::enable_auth`] turned
    /// authentication on under a configuration without a user.
    kv: Arc<RwLock<EtcdKv>>,
}

/// etcd's superuser.
pub const ROOT_USER: &str = "root";

impl Admin {
    /// Prepares the connection (lazily, as [`EtcdKv::connect`]: a down etcd is an error of
    /// the first call), logging in with `cfg.auth` on first use.
    pub async fn connect(cfg: &EtcdConfig) -> Result<Admin, KvError> {
        Ok(Admin {
            cfg: cfg.clone(),
            kv: Arc::new(RwLock::new(EtcdKv::connect(cfg).await?)),
        })
    }

    fn kv(&self) -> EtcdKv {
        self.kv
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Creates `spec.name` if missing and makes its permissions exactly `spec.permissions`
    /// (grants the missing ones, revokes the others).
    pub async fn ensure_role(&self, spec: &RoleSpec) -> Result<(), KvError> {
        let name = spec.name.as_str();
        let held = match self.kv().role_grants(name).await? {
            Some(held) => held,
            None => {
                self.kv().role_add(name).await?;
                Vec::new()
            }
        };
        let wanted: Vec<Grant> = spec.permissions.iter().map(Grant::from).collect();
        // A permission on the same range with another access is replaced by the grant (etcd
        // keeps one per range), so revoke only ranges not wanted at all.
        for grant in held.iter().filter(|h| {
            !wanted
                .iter()
                .any(|w| w.key == h.key && w.range_end == h.range_end)
        }) {
            self.kv().role_revoke(name, grant).await?;
        }
        for grant in wanted.iter().filter(|w| !held.contains(w)) {
            self.kv().role_grant(name, grant).await?;
        }
        Ok(())
    }

    /// Creates user `name` if missing (with `password`; a user that exists gets it set when
    /// `password` is given) and grants it `roles` (roles it holds beyond them are revoked).
    /// Without a password a new user can log in only by TLS certificate.
    pub async fn ensure_user(
        &self,
        name: &str,
        password: Option<&str>,
        roles: &[String],
    ) -> Result<(), KvError> {
        let held = match self.kv().user_roles(name).await? {
            Some(held) => {
                if let Some(password) = password {
                    self.kv().user_password(name, password).await?;
                }
                held
            }
            None => {
                self.kv().user_add(name, password).await?;
                Vec::new()
            }
        };
        for role in held.iter().filter(|r| !roles.contains(r)) {
            self.kv().user_revoke(name, role).await?;
        }
        for role in roles.iter().filter(|r| !held.contains(r)) {
            self.kv().user_grant(name, role).await?;
        }
        Ok(())
    }

    /// Deletes user `name`; a missing user is not an error.
    pub async fn remove_user(&self, name: &str) -> Result<(), KvError> {
        self.kv().user_delete(name).await
    }

    /// Deletes role `name`; a missing role is not an error.
    pub async fn remove_role(&self, name: &str) -> Result<(), KvError> {
        self.kv().role_delete(name).await
    }

    /// The users and their roles, by name.
    pub async fn users(&self) -> Result<Vec<UserInfo>, KvError> {
        let mut users = Vec::new();
        for name in self.kv().user_names().await? {
            // A user deleted between the listing and this read is gone: skip it.
            if let Some(roles) = self.kv().user_roles(&name).await? {
                users.push(UserInfo { name, roles });
            }
        }
        users.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(users)
    }

    /// Makes sure user `root` exists with `root_password` and role `root`, then enables
    /// authentication (a no-op when it is on already). Later calls of this `Admin` log in
    /// as `root` if its configuration named no user.
    pub async fn enable_auth(&self, root_password: &str) -> Result<(), KvError> {
        self.ensure_user(ROOT_USER, Some(root_password), &[ROLE_ROOT.to_owned()])
            .await?;
        self.kv().auth_enable().await?;
        if self.cfg.auth.is_none() {
            let root = EtcdConfig {
                auth: Some(EtcdAuth {
                    username: ROOT_USER.to_owned(),
                    password: root_password.to_owned(),
                }),
                ..self.cfg.clone()
            };
            let kv = EtcdKv::connect(&root).await?;
            *self.kv.write().unwrap_or_else(PoisonError::into_inner) = kv;
        } else {
            self.kv().login_again().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> MachineId {
        s.parse().unwrap()
    }

    #[test]
    fn a_machine_role_reaches_its_own_keys_and_no_other_machines() {
        let keys = Keys::new("/p/");
        let role = machine(&keys, &m("m1"));
        assert!(role.permits(Access::Write, "/p/machine/m1"));
        assert!(!role.permits(Access::Write, "/p/machine/m10"));
        // Others' presence is read (its peers), never written.
        assert!(role.permits(Access::Read, "/p/machine/m2"));
        assert!(role.permits(Access::Write, "/p/unit-state/m1/a.service"));
        assert!(!role.permits(Access::Write, "/p/unit-state/m2/a.service"));
        assert!(role.permits(Access::Read, "/p/schedule/m1/a.service"));
        assert!(!role.permits(Access::Write, "/p/schedule/m1/a.service"));
        assert!(!role.permits(Access::Read, "/p/schedule/m2/a.service"));
        assert!(!role.permits(Access::Write, "/p/unit/a.service"));
        assert!(!role.permits(Access::Write, "/p/engine/leader"));
    }

    /// Issue 36: the history of where a unit ran is what lets a machine hold the unit's
    /// placement back, so no machine may write it, its own part included.
    #[test]
    fn only_the_engine_writes_the_placement_history() {
        let keys = Keys::new("/p/");
        let key = "/p/left/a.service/m1";
        assert!(engine(&keys).permits(Access::Write, key));
        assert!(!machine(&keys, &m("m1")).permits(Access::Write, key));
        assert!(!operator(&keys).permits(Access::Write, key));
    }

    /// Issue 41: each writer's events are its own prefix; a host writes its own agent's
    /// events and no other machine's, and every reader reads them all.
    #[test]
    fn each_role_writes_only_its_own_events_and_a_viewer_reads_them_all() {
        let keys = Keys::new("/p/");
        let stamp = "00000000000000000001-0000000000000001";
        let user = format!("/p/event/user/unit/a.service/{stamp}");
        let engine_key = format!("/p/event/engine/unit/a.service/{stamp}");
        let m1 = format!("/p/event/machine/m1/unit/a.service/{stamp}");
        let m10 = format!("/p/event/machine/m10/unit/a.service/{stamp}");
        let host = machine(&keys, &m("m1"));
        assert!(host.permits(Access::Write, &m1));
        for key in [&m10, &user, &engine_key] {
            assert!(!host.permits(Access::Write, key), "{key}");
        }
        assert!(operator(&keys).permits(Access::Write, &user));
        assert!(!operator(&keys).permits(Access::Write, &engine_key));
        assert!(!operator(&keys).permits(Access::Write, &m1));
        assert!(engine(&keys).permits(Access::Write, &engine_key));
        assert!(!engine(&keys).permits(Access::Write, &user));
        for key in [&user, &engine_key, &m1, &m10, &"/p/event/".to_owned()] {
            assert!(viewer(&keys).permits(Access::Read, key), "{key}");
            assert!(!viewer(&keys).permits(Access::Write, key), "{key}");
        }
    }

    #[test]
    fn an_operator_writes_units_but_never_a_schedule_a_state_or_a_presence() {
        let keys = Keys::new("/p/");
        let role = operator(&keys);
        assert!(role.permits(Access::Write, "/p/unit/a.service"));
        assert!(role.permits(Access::Read, "/p/schedule/m1/a.service"));
        for key in [
            "/p/schedule/m1/a.service",
            "/p/unit-state/m1/a.service",
            "/p/machine/m1",
            "/p/engine/leader",
        ] {
            assert!(!role.permits(Access::Write, key), "{key}");
        }
        assert!(!viewer(&keys).permits(Access::Write, "/p/unit/a.service"));
    }
}
