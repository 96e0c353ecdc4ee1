//! etcd's user and role administration RPCs, for [`rbac::Admin`](crate::rbac::Admin): one
//! call each, in this crate's types, through the same members, login and failover as every
//! other call. Deciding what to change (idempotence) is `rbac::Admin`'s; this only asks.
//! A missing user or role is `None` (or nothing done), never an error.

use etcd_client::UserAddOptions;
use etcd_client::{
    Client, Permission as EtcdPermission, PermissionType, RoleRevokePermissionOptions,
};

use super::{EtcdKv, Failure, Request, prefix_end};
use crate::kv::KvError;
use crate::rbac::{Access, Permission};

/// One permission as etcd stores it: a key and the end of its range (empty: the key alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub access: Access,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

impl From<&Permission> for Grant {
    fn from(p: &Permission) -> Grant {
        Grant {
            access: p.access,
            key: p.key.as_bytes().to_vec(),
            range_end: if p.prefix {
                prefix_end(p.key.as_bytes())
            } else {
                Vec::new()
            },
        }
    }
}

fn access_of(perm_type: i32) -> Access {
    match PermissionType::try_from(perm_type) {
        Ok(PermissionType::Write) => Access::Write,
        Ok(PermissionType::Readwrite) => Access::ReadWrite,
        // etcd's default (0) is READ.
        Ok(PermissionType::Read) | Err(_) => Access::Read,
    }
}

fn etcd_permission(grant: &Grant) -> EtcdPermission {
    let perm_type = match grant.access {
        Access::Read => PermissionType::Read,
        Access::Write => PermissionType::Write,
        Access::ReadWrite => PermissionType::Readwrite,
    };
    let perm = EtcdPermission::new(perm_type, grant.key.clone());
    if grant.range_end.is_empty() {
        perm
    } else {
        perm.with_range_end(grant.range_end.clone())
    }
}

/// Whether etcd refused with `text` (a missing or existing user or role).
fn refused_with(failure: &Failure, text: &str) -> bool {
    matches!(failure, Failure::Refused(m) if m.contains(text))
}

const ROLE_NOT_FOUND: &str = "role name not found";
const USER_NOT_FOUND: &str = "user name not found";

impl EtcdKv {
    /// Role `name`'s permissions; `None` when there is no such role.
    pub(crate) async fn role_grants(&self, name: &str) -> Result<Option<Vec<Grant>>, KvError> {
        let get = |c: Client| async move { c.auth_client().role_get(name).await };
        match self.read(get).await {
            Ok(resp) => Ok(Some(
                resp.permissions()
                    .iter()
                    .map(|p| Grant {
                        access: access_of(p.get_type()),
                        key: p.key().to_vec(),
                        range_end: p.range_end().to_vec(),
                    })
                    .collect(),
            )),
            Err(f) if refused_with(&f, ROLE_NOT_FOUND) => Ok(None),
            Err(f) => Err(self.error(f, Request::Admin(&format!("read role {name}")))),
        }
    }

    pub(crate) async fn role_add(&self, name: &str) -> Result<(), KvError> {
        let add = |c: Client| async move { c.auth_client().role_add(name).await };
        match self.write(add).await {
            Ok(_) => Ok(()),
            Err(f) if refused_with(&f, "role name already exists") => Ok(()),
            Err(f) => Err(self.error(f, Request::Admin(&format!("add role {name}")))),
        }
    }

    pub(crate) async fn role_delete(&self, name: &str) -> Result<(), KvError> {
        let delete = |c: Client| async move { c.auth_client().role_delete(name).await };
        match self.write(delete).await {
            Ok(_) => Ok(()),
            Err(f) if refused_with(&f, ROLE_NOT_FOUND) => Ok(()),
            Err(f) => Err(self.error(f, Request::Admin(&format!("delete role {name}")))),
        }
    }

    pub(crate) async fn role_grant(&self, name: &str, grant: &Grant) -> Result<(), KvError> {
        let perm = etcd_permission(grant);
        let add = |c: Client| {
            let perm = perm.clone();
            async move { c.auth_client().role_grant_permission(name, perm).await }
        };
        self.write(add).await.map(drop).map_err(|f| {
            let what = format!("grant role {name} {}", describe(grant));
            self.error(f, Request::Admin(&what))
        })
    }

    pub(crate) async fn role_revoke(&self, name: &str, grant: &Grant) -> Result<(), KvError> {
        let revoke = |c: Client| {
            let options = (!grant.range_end.is_empty()).then(|| {
                RoleRevokePermissionOptions::new().with_range_end(grant.range_end.clone())
            });
            let key = grant.key.clone();
            async move {
                c.auth_client()
                    .role_revoke_permission(name, key, options)
                    .await
            }
        };
        match self.write(revoke).await {
            Ok(_) => Ok(()),
            Err(f) if refused_with(&f, "permission is not granted") => Ok(()),
            Err(f) => {
                let what = format!("revoke from role {name} {}", describe(grant));
                Err(self.error(f, Request::Admin(&what)))
            }
        }
    }

    /// User `name`'s roles; `None` when there is no such user.
    pub(crate) async fn user_roles(&self, name: &str) -> Result<Option<Vec<String>>, KvError> {
        let get = |c: Client| async move { c.auth_client().user_get(name).await };
        match self.read(get).await {
            Ok(resp) => Ok(Some(resp.roles().to_vec())),
            Err(f) if refused_with(&f, USER_NOT_FOUND) => Ok(None),
            Err(f) => Err(self.error(f, Request::Admin(&format!("read user {name}")))),
        }
    }

    /// Adds user `name`, with `password` or, without one, for TLS certificate login only.
    pub(crate) async fn user_add(&self, name: &str, password: Option<&str>) -> Result<(), KvError> {
        let add = |c: Client| async move {
            let options = password
                .is_none()
                .then(|| UserAddOptions::new().with_no_pwd());
            c.auth_client()
                .user_add(name, password.unwrap_or(""), options)
                .await
        };
        self.write(add)
            .await
            .map(drop)
            .map_err(|f| self.error(f, Request::Admin(&format!("add user {name}"))))
    }

    pub(crate) async fn user_password(&self, name: &str, password: &str) -> Result<(), KvError> {
        let change =
            |c: Client| async move { c.auth_client().user_change_password(name, password).await };
        self.write(change).await.map(drop).map_err(|f| {
            self.error(
                f,
                Request::Admin(&format!("change the password of user {name}")),
            )
        })
    }

    pub(crate) async fn user_grant(&self, name: &str, role: &str) -> Result<(), KvError> {
        let grant = |c: Client| async move { c.auth_client().user_grant_role(name, role).await };
        self.write(grant).await.map(drop).map_err(|f| {
            self.error(
                f,
                Request::Admin(&format!("grant role {role} to user {name}")),
            )
        })
    }

    pub(crate) async fn user_revoke(&self, name: &str, role: &str) -> Result<(), KvError> {
        let revoke = |c: Client| async move { c.auth_client().user_revoke_role(name, role).await };
        match self.write(revoke).await {
            Ok(_) => Ok(()),
            Err(f) if refused_with(&f, "role is not granted") => Ok(()),
            Err(f) => {
                let what = format!("revoke role {role} from user {name}");
                Err(self.error(f, Request::Admin(&what)))
            }
        }
    }

    pub(crate) async fn user_delete(&self, name: &str) -> Result<(), KvError> {
        let delete = |c: Client| async move { c.auth_client().user_delete(name).await };
        match self.write(delete).await {
            Ok(_) => Ok(()),
            Err(f) if refused_with(&f, USER_NOT_FOUND) => Ok(()),
            Err(f) => Err(self.error(f, Request::Admin(&format!("delete user {name}")))),
        }
    }

    pub(crate) async fn user_names(&self) -> Result<Vec<String>, KvError> {
        let list = |c: Client| async move { c.auth_client().user_list().await };
        match self.read(list).await {
            Ok(resp) => Ok(resp.users().to_vec()),
            Err(f) => Err(self.error(f, Request::Admin("list users"))),
        }
    }

    /// Turns etcd's authentication on (nothing happens when it is on already).
    pub(crate) async fn auth_enable(&self) -> Result<(), KvError> {
        let enable = |c: Client| async move { c.auth_client().auth_enable().await };
        self.write(enable)
            .await
            .map(drop)
            .map_err(|f| self.error(f, Request::Admin("enable authentication")))
    }

    /// Makes every member's client log in again on its next call: after authentication was
    /// turned on under a client that found it off.
    pub(crate) async fn login_again(&self) {
        for index in 0..self.members.len() {
            if let Some(login) = &self.members.get(index).login {
                login.forget().await;
            }
        }
    }
}

fn describe(grant: &Grant) -> String {
    let access = match grant.access {
        Access::Read => "read",
        Access::Write => "write",
        Access::ReadWrite => "readwrite",
    };
    let key = String::from_utf8_lossy(&grant.key);
    if grant.range_end.is_empty() {
        format!("{access} on {key}")
    } else {
        format!("{access} on the keys under {key}")
    }
}
