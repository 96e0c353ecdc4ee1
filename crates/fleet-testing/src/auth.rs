//! etcd's authentication on a test server or cluster: user `root` with a known password, and
//! users holding fleet's roles, each with a password of its own.

use rand::Rng;

use fleet_registry::kv::{EtcdAuth, EtcdConfig};
use fleet_registry::rbac::{Admin, ROOT_USER, RoleSpec};

/// The password of user `root` on a test etcd with authentication.
pub const ROOT_PASSWORD: &str = "fleet-test-root-password";

/// User `root` with [`ROOT_PASSWORD`].
pub(crate) fn root_auth() -> EtcdAuth {
    EtcdAuth {
        username: ROOT_USER.to_owned(),
        password: ROOT_PASSWORD.to_owned(),
    }
}

/// Turns authentication on through `cfg` (root's credentials, used anonymously while auth is
/// off).
pub(crate) async fn enable_auth(cfg: &EtcdConfig) {
    let admin = Admin::connect(cfg)
        .await
        .expect("a loopback etcd config is valid");
    if let Err(err) = admin.enable_auth(ROOT_PASSWORD).await {
        panic!("enabling auth on test etcd: {err}");
    }
}

/// See [`TestEtcd::issue_user`](crate::TestEtcd::issue_user); `root` is root's configuration.
pub(crate) async fn issue_user(root: &EtcdConfig, name: &str, roles: &[RoleSpec]) -> EtcdConfig {
    let admin = Admin::connect(root)
        .await
        .expect("a loopback etcd config is valid");
    for role in roles {
        if let Err(err) = admin.ensure_role(role).await {
            panic!("creating role {} on test etcd: {err}", role.name);
        }
    }
    let password = format!("{name}-{:08x}", rand::rng().random::<u32>());
    let names: Vec<String> = roles.iter().map(|r| r.name.clone()).collect();
    if let Err(err) = admin.ensure_user(name, Some(&password), &names).await {
        panic!("creating user {name} on test etcd: {err}");
    }
    EtcdConfig {
        auth: Some(EtcdAuth {
            username: name.to_owned(),
            password,
        }),
        ..root.clone()
    }
}
