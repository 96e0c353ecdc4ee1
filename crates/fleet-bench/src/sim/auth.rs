//! etcd's users for a production-shaped simulation (issue 43), made as `fleetctl auth setup`
//! and `fleetctl auth add-host` make them: the three shared roles (viewer, operator,
//! engine), an operator and a viewer for fleetctl, and for every machine its own role and
//! its own user (`fleet_registry::rbac::host_roles`: an agent-only host, or an engine host
//! for the machines that run an engine candidate; no API).
//!
//! It runs as etcd's `root` on a server started with authentication on, before any machine
//! connects, and is timed: etcd 3.4 hashes each new password with bcrypt inside its apply
//! loop, so thousands of users are a real cost of setting a cluster up.

use anyhow::{Context, Result};
use fleet_registry::DEFAULT_PREFIX;
use fleet_testing::TestEtcd;

use super::{SimSpec, machine_id};
use fleet_core::MachineId;
use fleet_registry::Keys;
use fleet_registry::kv::EtcdAuth;
use fleet_registry::rbac::{self, Admin, ApiGrant, HostGrant};
use futures::StreamExt;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// Machines' roles and users made at once: etcd applies them one by one, but more in flight
/// share its commits (500 machines took 17 s with 8, 9 s with 64; debug build, loaded host).
const IN_FLIGHT: usize = 64;

/// The credentials of a simulation with etcd's authentication on.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// Machine `i`'s fleetd user, `fleet-host-<id>`.
    pub machines: Vec<EtcdAuth>,
    /// fleetctl's user (role fleet-operator).
    pub operator: EtcdAuth,
    /// A read-only user (role fleet-viewer): `events --follow`.
    pub viewer: EtcdAuth,
    /// How long making every role and user took.
    pub took: Duration,
    /// Whether this simulation's etcd started on a copy of an earlier one's users.
    pub copied: bool,
}

fn password(user: &str) -> String {
    format!("{user}-bench-{}", std::process::id())
}

fn auth(user: String) -> EtcdAuth {
    let password = password(&user);
    EtcdAuth {
        username: user,
        password,
    }
}

/// Makes every role and user; machines `0..engines` are engine hosts.
pub async fn issue(
    admin: &Admin,
    keys: &Keys,
    ids: &[MachineId],
    engines: usize,
) -> Result<Credentials> {
    let started = Instant::now();
    for role in [rbac::viewer(keys), rbac::operator(keys), rbac::engine(keys)] {
        admin
            .ensure_role(&role)
            .await
            .with_context(|| format!("creating role {}", role.name))?;
    }
    let operator = auth("bench-operator".to_owned());
    let viewer = auth("bench-viewer".to_owned());
    for (user, role) in [
        (&operator, rbac::ROLE_OPERATOR),
        (&viewer, rbac::ROLE_VIEWER),
    ] {
        admin
            .ensure_user(&user.username, Some(&user.password), &[role.to_owned()])
            .await
            .with_context(|| format!("creating user {}", user.username))?;
    }
    // Every machine's role first, then the users: each of etcd 3.4's auth changes costs more
    // the more users it holds (about 55 changes a second near 5,000 users, against some 700
    // near 500). Made host by host (`auth add-host` after `auth add-host`), the 5,000
    // machines' roles and users took 719 s here; the end state is the same.
    let roles: Vec<Result<()>> = futures::stream::iter(ids.iter())
        .map(|id| add_machine_role(admin, keys, id))
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    roles.into_iter().collect::<Result<Vec<()>>>()?;
    let made: Vec<Result<EtcdAuth>> = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| add_host_user(admin, keys, id, i < engines))
        .buffered(IN_FLIGHT)
        .collect()
        .await;
    Ok(Credentials {
        machines: made.into_iter().collect::<Result<_>>()?,
        operator,
        viewer,
        took: started.elapsed(),
        copied: false,
    })
}

fn host_grant(id: &MachineId, engine: bool) -> HostGrant {
    HostGrant {
        machine: id.clone(),
        engine,
        api: ApiGrant::None,
    }
}

/// The machine's own role, as `fleetctl auth add-host ID` makes it.
async fn add_machine_role(admin: &Admin, keys: &Keys, id: &MachineId) -> Result<()> {
    let roles = rbac::host_roles(keys, &host_grant(id, false));
    admin
        .ensure_role(&roles[0])
        .await
        .with_context(|| format!("creating role {}", roles[0].name))
}

/// The machine's user holding its roles, as `fleetctl auth add-host ID [--engine]` makes it
/// (its machine role and the shared ones exist already).
async fn add_host_user(
    admin: &Admin,
    keys: &Keys,
    id: &MachineId,
    engine: bool,
) -> Result<EtcdAuth> {
    let roles = rbac::host_roles(keys, &host_grant(id, engine));
    let user = auth(rbac::host_user_name(id));
    let names: Vec<String> = roles.iter().map(|r| r.name.clone()).collect();
    admin
        .ensure_user(&user.username, Some(&user.password), &names)
        .await
        .with_context(|| format!("creating user {}", user.username))?;
    Ok(user)
}

/// An etcd's data holding the roles and users of one simulation's size, kept to start the
/// run's later simulations of that size on a copy.
struct Seed {
    machines: usize,
    engines: usize,
    data: PathBuf,
    credentials: Credentials,
}

/// This process's seeds: making 5,000 machines' users takes minutes of etcd 3.4's time
/// (see [`issue`]), and `scale` starts two simulations of that size, `plot` a grid.
static SEEDS: Mutex<Vec<Seed>> = Mutex::new(Vec::new());

fn seeds() -> std::sync::MutexGuard<'static, Vec<Seed>> {
    SEEDS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The simulation's etcd, with its roles and users when the shape turns auth on: made on
/// the run's first etcd of this size, copied from it after.
pub(super) async fn start_etcd(spec: &SimSpec) -> Result<(TestEtcd, Option<Credentials>)> {
    let shape = &spec.shape;
    if !shape.auth {
        return Ok((TestEtcd::start_with_args(&shape.etcd_args).await, None));
    }
    let found = seeds()
        .iter()
        .find(|s| s.machines == spec.machines && s.engines == spec.engines)
        .map(|s| (s.data.clone(), s.credentials.clone()));
    if let Some((data, credentials)) = found {
        let etcd = TestEtcd::start_from_data(&data, true, &shape.etcd_args).await;
        let copied = Credentials {
            copied: true,
            ..credentials
        };
        return Ok((etcd, Some(copied)));
    }
    let mut etcd = TestEtcd::start_auth_with_args(&shape.etcd_args).await;
    let ids: Vec<MachineId> = (0..spec.machines).map(machine_id).collect();
    let keys = Keys::new(DEFAULT_PREFIX);
    let credentials = issue(&etcd.admin().await, &keys, &ids, spec.engines).await?;
    let data = seed_dir(spec);
    let _ = std::fs::remove_dir_all(&data);
    etcd.copy_data(&data)
        .await
        .with_context(|| format!("keeping etcd's users in {}", data.display()))?;
    seeds().push(Seed {
        machines: spec.machines,
        engines: spec.engines,
        data,
        credentials: credentials.clone(),
    });
    Ok((etcd, Some(credentials)))
}

fn seed_dir(spec: &SimSpec) -> PathBuf {
    crate::report::work_dir().join(format!(
        "etcd-users-{}-{}-{}",
        std::process::id(),
        spec.machines,
        spec.engines
    ))
}

/// Deletes the kept copies of etcd's users (at the end of the run).
pub fn forget_seeds() {
    for seed in seeds().drain(..) {
        let _ = std::fs::remove_dir_all(&seed.data);
    }
}

/// Writes `password` to `file`, readable by its owner only (fleetctl refuses anything else).
pub(super) fn write_secret(file: &std::path::Path, password: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(file);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
        .with_context(|| format!("creating {}", file.display()))?;
    writeln!(f, "{password}").with_context(|| format!("writing {}", file.display()))
}
