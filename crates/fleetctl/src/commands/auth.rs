//! `fleetctl auth`: etcd's RBAC for fleet (issue 17), done as etcd's root user over the etcd
//! driver (fleet's API has no user administration). The roles are `fleet_registry::rbac`'s;
//! this module only turns the arguments into [`Step`]s (pure, [`setup`], [`add_host`],
//! [`remove_host`]) and applies them in order with [`rbac::Admin`], saying each as it is done.
//!
//! Every step is idempotent (`Admin`'s calls are), so a setup run twice changes nothing the
//! second time. Roles come before the users that hold them, and `auth enable` comes last:
//! before it, the root user can do nothing that anonymous access could not.

use anyhow::{Context, Result, anyhow};
use fleet_core::MachineId;
use fleet_registry::Keys;
use fleet_registry::input::shorten;
use fleet_registry::rbac::{self, Admin, ApiGrant, HostGrant, RoleSpec};

use crate::cli::{ApiAccess, AuthAddHost, AuthSetup};
use crate::commands::Ctx;
use crate::credentials::read_password;

/// A password read from a file; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One administration call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Role(RoleSpec),
    User {
        name: String,
        password: Option<Secret>,
        roles: Vec<String>,
    },
    Enable {
        root_password: Secret,
    },
    RemoveUser(String),
    RemoveRole(String),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Role(spec) => {
                let n = spec.permissions.len();
                write!(f, "role {}: {n} permission(s)", spec.name)
            }
            Step::User { name, roles, .. } => {
                write!(f, "user {name}: roles {}", roles.join(","))
            }
            Step::Enable { .. } => f.write_str("user root: role root; authentication enabled"),
            Step::RemoveUser(name) => write!(f, "user {name}: removed"),
            Step::RemoveRole(name) => write!(f, "role {name}: removed"),
        }
    }
}

/// The password files the arguments name, read.
#[derive(Debug, Default)]
pub struct SetupPasswords {
    pub root: Option<Secret>,
    pub operator: Option<Secret>,
    pub viewer: Option<Secret>,
}

impl SetupPasswords {
    pub fn read(a: &AuthSetup) -> Result<SetupPasswords> {
        let read = |p: &Option<std::path::PathBuf>| -> Result<Option<Secret>> {
            p.as_deref()
                .map(|p| read_password(p).map(Secret))
                .transpose()
        };
        Ok(SetupPasswords {
            root: read(&a.root_password_file)?,
            operator: read(&a.operator_password_file)?,
            viewer: read(&a.viewer_password_file)?,
        })
    }
}

/// `auth setup`: the three shared roles, the users asked for, then root and `auth enable`.
pub fn setup(keys: &Keys, a: &AuthSetup, pw: SetupPasswords) -> Result<Vec<Step>> {
    let mut steps: Vec<Step> = [rbac::viewer(keys), rbac::operator(keys), rbac::engine(keys)]
        .into_iter()
        .map(Step::Role)
        .collect();
    for (name, password, role) in [
        (&a.operator, pw.operator, rbac::ROLE_OPERATOR),
        (&a.viewer, pw.viewer, rbac::ROLE_VIEWER),
    ] {
        if let Some(name) = name {
            steps.push(Step::User {
                name: user_name(name)?,
                password,
                roles: vec![role.to_owned()],
            });
        }
    }
    if a.enable {
        let root_password = pw
            .root
            .ok_or_else(|| anyhow!("--enable needs --root-password-file"))?;
        steps.push(Step::Enable { root_password });
    }
    Ok(steps)
}

/// `auth add-host`: the roles of the host's user (its machine role first), then the user.
pub fn add_host(keys: &Keys, a: &AuthAddHost, password: Secret) -> Result<Vec<Step>> {
    let machine = machine_id(&a.machine)?;
    let grant = HostGrant {
        machine: machine.clone(),
        engine: a.engine,
        api: match a.api {
            ApiAccess::None => ApiGrant::None,
            ApiAccess::Read => ApiGrant::Read,
            ApiAccess::Write => ApiGrant::Write,
        },
    };
    let roles = rbac::host_roles(keys, &grant);
    let names = roles.iter().map(|r| r.name.clone()).collect();
    let mut steps: Vec<Step> = roles.into_iter().map(Step::Role).collect();
    steps.push(Step::User {
        name: rbac::host_user_name(&machine),
        password: Some(password),
        roles: names,
    });
    Ok(steps)
}

/// `auth remove-host`: the user first, so that it never holds a missing role.
pub fn remove_host(machine: &str) -> Result<Vec<Step>> {
    let machine = machine_id(machine)?;
    Ok(vec![
        Step::RemoveUser(rbac::host_user_name(&machine)),
        Step::RemoveRole(rbac::machine_role_name(&machine)),
    ])
}

fn machine_id(arg: &str) -> Result<MachineId> {
    arg.parse()
        .map_err(|e| anyhow!("invalid machine ID {:?}: {e}", shorten(arg)))
}

/// An etcd user name fleet creates: printable, no space, not `root` (etcd's own).
fn user_name(name: &str) -> Result<String> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(anyhow!(
            "invalid user name {:?}: it must be non-empty, without spaces or control characters",
            shorten(name)
        ));
    }
    if name == "root" {
        return Err(anyhow!(
            "the user root is etcd's superuser; create it with --enable --root-password-file"
        ));
    }
    Ok(name.to_owned())
}

/// Applies `steps` in order, printing each once done; the first failure stops.
pub async fn apply<C>(ctx: &mut Ctx<C>, admin: &Admin, steps: &[Step]) -> Result<()> {
    for step in steps {
        let done = match step {
            Step::Role(spec) => admin.ensure_role(spec).await,
            Step::User {
                name,
                password,
                roles,
            } => {
                let password = password.as_ref().map(|s| s.0.as_str());
                admin.ensure_user(name, password, roles).await
            }
            Step::Enable { root_password } => admin.enable_auth(&root_password.0).await,
            Step::RemoveUser(name) => admin.remove_user(name).await,
            Step::RemoveRole(name) => admin.remove_role(name).await,
        };
        done.with_context(|| format!("Error applying {step}"))?;
        ctx.say(step.to_string());
    }
    Ok(())
}

/// `auth list`: each user and its roles.
pub async fn list<C>(ctx: &mut Ctx<C>, admin: &Admin) -> Result<()> {
    let users = admin.users().await.context("Error listing etcd's users")?;
    ctx.say("USER\tROLES");
    for u in users {
        ctx.say(format!("{}\t{}", u.name, u.roles.join(",")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn keys() -> Keys {
        Keys::new("/p/")
    }

    fn setup_args() -> AuthSetup {
        AuthSetup {
            enable: false,
            root_password_file: None,
            operator: None,
            operator_password_file: None,
            viewer: None,
            viewer_password_file: None,
        }
    }

    fn names(steps: &[Step]) -> Vec<String> {
        steps.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn setup_creates_the_three_roles_then_the_users_then_enables_auth_last() {
        let mut a = setup_args();
        a.enable = true;
        a.operator = Some("ops".into());
        a.viewer = Some("ro".into());
        let pw = SetupPasswords {
            root: Some(Secret("r".into())),
            operator: Some(Secret("o".into())),
            viewer: Some(Secret("v".into())),
        };
        let steps = setup(&keys(), &a, pw).unwrap();
        let shown = names(&steps);
        assert!(shown[0].starts_with("role fleet-viewer"), "{shown:?}");
        assert!(shown[1].starts_with("role fleet-operator"), "{shown:?}");
        assert!(shown[2].starts_with("role fleet-engine"), "{shown:?}");
        assert_eq!(shown[3], "user ops: roles fleet-operator");
        assert_eq!(shown[4], "user ro: roles fleet-viewer");
        assert!(
            matches!(steps.last(), Some(Step::Enable { .. })),
            "{shown:?}"
        );
        assert!(!format!("{steps:?}").contains("\"o\""), "{steps:?}");
    }

    #[test]
    fn setup_without_options_only_ensures_the_roles() {
        let steps = setup(&keys(), &setup_args(), SetupPasswords::default()).unwrap();
        assert_eq!(steps.len(), 3);
        assert!(steps.iter().all(|s| matches!(s, Step::Role(_))));
    }

    #[test]
    fn a_user_named_root_or_with_a_space_is_refused() {
        let mut a = setup_args();
        a.operator = Some("root".into());
        let e = setup(&keys(), &a, SetupPasswords::default()).unwrap_err();
        assert!(e.to_string().contains("etcd's superuser"), "{e}");
        a.operator = Some("a b".into());
        let e = setup(&keys(), &a, SetupPasswords::default()).unwrap_err();
        assert!(e.to_string().contains("invalid user name \"a b\""), "{e}");
    }

    #[test]
    fn an_engine_host_gets_its_machine_role_the_engine_role_and_its_apis_role() {
        let a = AuthAddHost {
            machine: "m1".into(),
            host_password_file: PathBuf::from("/unused"),
            engine: true,
            api: ApiAccess::Read,
        };
        let steps = add_host(&keys(), &a, Secret("pw".into())).unwrap();
        assert_eq!(
            names(&steps).last().unwrap(),
            "user fleet-host-m1: roles fleet-machine-m1,fleet-engine,fleet-viewer"
        );
        assert_eq!(steps.len(), 4);
        let agent_only = AuthAddHost {
            engine: false,
            api: ApiAccess::None,
            ..a
        };
        let steps = add_host(&keys(), &agent_only, Secret("pw".into())).unwrap();
        assert_eq!(
            names(&steps),
            [
                "role fleet-machine-m1: 7 permission(s)",
                "user fleet-host-m1: roles fleet-machine-m1"
            ]
        );
    }

    #[test]
    fn remove_host_removes_the_user_before_its_role_and_checks_the_id() {
        assert_eq!(
            names(&remove_host("m1").unwrap()),
            [
                "user fleet-host-m1: removed",
                "role fleet-machine-m1: removed"
            ]
        );
        assert!(remove_host("").is_err());
    }
}
