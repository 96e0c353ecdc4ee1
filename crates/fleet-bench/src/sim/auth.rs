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
use fleet_testing::{Shaped, TestEtcd};

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

/// Users made with one count in flight ([`in_flight`]) before it is counted again.
const USERS_PER_STEP: usize = 500;

/// What one auth change costs etcd 3.4 per user it holds: it rebuilds every user's merged
/// permissions on each change (`refreshRangePermCache`, 70 % of its CPU while users were
/// made). Measured at 10,000 machines (docs/benchmarks.md, *Past these sizes*): about 85 ms a
/// change at 6,543 users, where 64 changes in flight made the last wait past the admin's
/// 5 s deadline and the run could not start.
const CHANGE_PER_USER: Duration = Duration::from_micros(13);

/// How many auth changes to keep in flight while etcd holds `users` users: as many as
/// [`IN_FLIGHT`], fewer once the queue would wait more than about a second.
fn in_flight(users: usize) -> usize {
    let one = CHANGE_PER_USER.saturating_mul(u32::try_from(users).unwrap_or(u32::MAX));
    let fit = Duration::from_secs(1).as_nanos() / one.as_nanos().max(1);
    usize::try_from(fit)
        .unwrap_or(IN_FLIGHT)
        .clamp(1, IN_FLIGHT)
}

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
    let mut machines = Vec::with_capacity(ids.len());
    for (step, chunk) in ids.chunks(USERS_PER_STEP).enumerate() {
        let first = step * USERS_PER_STEP;
        let made: Vec<Result<EtcdAuth>> = futures::stream::iter(chunk.iter().enumerate())
            .map(|(i, id)| add_host_user(admin, keys, id, first + i < engines))
            .buffered(in_flight(first))
            .collect()
            .await;
        for user in made {
            machines.push(user?);
        }
    }
    Ok(Credentials {
        machines,
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
    let shaped = Shaped {
        tls: shape.tls,
        auth: shape.auth,
        args: &shape.etcd_args,
        data: None,
    };
    if !shape.auth {
        return Ok((TestEtcd::start_shaped(shaped).await, None));
    }
    let found = seeds()
        .iter()
        .find(|s| s.machines == spec.machines && s.engines == spec.engines)
        .map(|s| (s.data.clone(), s.credentials.clone()));
    if let Some((data, credentials)) = found {
        let etcd = TestEtcd::start_shaped(Shaped {
            data: Some(&data),
            ..shaped
        })
        .await;
        let copied = Credentials {
            copied: true,
            ..credentials
        };
        return Ok((etcd, Some(copied)));
    }
    let mut etcd = TestEtcd::start_shaped(shaped).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_auth_changes_are_in_flight_the_more_users_etcd_holds() {
        assert_eq!(in_flight(0), IN_FLIGHT);
        assert_eq!(in_flight(1_000), IN_FLIGHT);
        // 5,000 users: 65 ms a change, 15 of them in a second.
        assert_eq!(in_flight(5_000), 15);
        // 10,000: 130 ms, 7; what the admin's 5 s deadline took 64 of at 6,543 (85 ms).
        assert_eq!(in_flight(10_000), 7);
        assert_eq!(in_flight(1_000_000), 1);
    }
}
