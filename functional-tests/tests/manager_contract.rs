//! Keeps the fake systemd honest: the same test bodies run on [`FakeManager`] (in memory, as
//! the agent loop's tests use it) and on [`SystemdManager`] against a real systemd, PID 1 of a
//! functional-test machine, as `crates/fleet-registry/tests/kv_contract.rs` does for the `Kv`
//! seam. A body sees only the [`UnitManager`] trait plus [`Side`], the few things a test must
//! do outside it (plant a file, make a start fail).
//!
//! The real side must run where the machine's systemd sees the same files as the manager:
//! inside the machine's mount namespace. `real_systemd_keeps_the_contract` boots one bare
//! machine and runs this very test binary in it (through `nsenter`, from the machine's
//! `/opt/fleet/bin`, the host's bin dir), once per body, as the ignored test
//! `inside::<body>`; each body uses unit names of its own. Needs root.

use fleet_agent::fake::FakeJob;
use fleet_agent::{
    Change, FakeManager, JobKind, JobOutcome, MainExit, ManagerError, SystemdConfig,
    SystemdManager, UnitManager, UnitSource,
};
use fleet_core::{UnitFile, UnitName};
use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

/// What a body needs besides the trait.
trait Side: UnitManager {
    /// Writes a raw file into the units directory.
    fn plant(&self, file_name: &str, bytes: &[u8]);
    /// Makes the next start of `name` fail. The real side needs nothing: the bodies give such
    /// units a file whose start fails (`Type=oneshot`, `ExecStart=/bin/false`).
    fn will_fail_to_start(&self, name: &UnitName);
    /// Gives systemd an operator's own (stopped) unit `name`, from a file outside the units
    /// directory.
    fn plant_operator_unit(&self, name: &UnitName, file: &UnitFile);
}

impl Side for FakeManager {
    fn plant(&self, file_name: &str, bytes: &[u8]) {
        self.put_file(file_name, bytes.to_vec());
    }
    fn will_fail_to_start(&self, name: &UnitName) {
        self.set_job(JobKind::Start, name, FakeJob::Ends(JobOutcome::Failed));
    }
    fn plant_operator_unit(&self, name: &UnitName, _file: &UnitFile) {
        self.put_foreign_unit(name, "inactive", "dead");
    }
}

/// The units directory of the real side: one body runs per process.
static REAL_UNITS_DIR: OnceLock<PathBuf> = OnceLock::new();

impl Side for SystemdManager {
    fn plant(&self, file_name: &str, bytes: &[u8]) {
        let dir = REAL_UNITS_DIR.get().expect("set before the body runs");
        std::fs::write(dir.join(file_name), bytes).unwrap();
    }
    fn will_fail_to_start(&self, _name: &UnitName) {}
    fn plant_operator_unit(&self, name: &UnitName, file: &UnitFile) {
        // Written straight into systemd's runtime directory, as an operator would; a new unit
        // loads on demand.
        let path =
            PathBuf::from(fleet_agent::units_dir::DEFAULT_RUNTIME_UNIT_DIR).join(name.as_str());
        std::fs::write(path, file.canonical()).unwrap();
    }
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn service(body: &str) -> UnitFile {
    UnitFile::parse(format!("[Service]\n{body}\n").as_bytes()).unwrap()
}

fn sleeper() -> UnitFile {
    service("ExecStart=/bin/sleep 1000")
}

async fn state<S: Side>(side: &S, unit: &UnitName) -> (String, String, String) {
    let status = side.status(std::slice::from_ref(unit)).await.unwrap();
    let s = &status[unit];
    (s.load.clone(), s.active.clone(), s.sub.clone())
}

fn strs(s: &(String, String, String)) -> (&str, &str, &str) {
    (&s.0, &s.1, &s.2)
}

// ---- the bodies ------------------------------------------------------------------------------

async fn installs_starts_stops_and_uninstalls_a_unit<S: Side>(side: &S) {
    let unit = name("contract-lifecycle.service");
    let file = sleeper();
    side.install(&unit, &file).await.unwrap();
    let installed = side.installed().await.unwrap();
    let entry = installed.iter().find(|u| u.name == unit).expect("listed");
    assert_eq!(*entry.content.as_ref().unwrap(), file.hash());
    assert!(entry.linked, "installed units are linked");
    let absent = name("contract-absent.service");
    let some = side.installed_of(&[absent, unit.clone()]).await.unwrap();
    assert_eq!(some.len(), 1, "only the file that exists");
    assert_eq!(some[0].name, unit);
    assert_eq!(*some[0].content.as_ref().unwrap(), file.hash());
    assert!(some[0].linked);
    assert_eq!(
        strs(&state(side, &unit).await),
        ("loaded", "inactive", "dead")
    );

    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Done);
    assert_eq!(
        strs(&state(side, &unit).await),
        ("loaded", "active", "running")
    );
    let details = side.details(&unit).await.unwrap();
    assert!(details.main_pid.is_some(), "{details:?}");
    assert!(!details.need_daemon_reload);

    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::Done);
    assert_eq!(
        strs(&state(side, &unit).await),
        ("loaded", "inactive", "dead")
    );
    side.uninstall(&unit).await.unwrap();
    assert!(side.installed().await.unwrap().is_empty());
    assert!(
        side.installed_of(std::slice::from_ref(&unit))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        strs(&state(side, &unit).await),
        ("not-found", "inactive", "dead")
    );
}

async fn stopping_a_unit_systemd_does_not_have_is_not_loaded<S: Side>(side: &S) {
    let unit = name("contract-unknown.service");
    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::NotLoaded);
}

async fn starting_a_unit_without_a_file_fails_with_no_such_unit<S: Side>(side: &S) {
    let err = side
        .start(&name("contract-nofile.service"))
        .await
        .unwrap_err();
    let ManagerError::QueueJob { source, .. } = err else {
        panic!("unexpected {err:?}");
    };
    assert!(source.is_no_such_unit(), "{source:?}");
}

async fn a_changed_loaded_unit_runs_its_old_file_until_a_reload<S: Side>(side: &S) {
    let unit = name("contract-changed.service");
    side.install(&unit, &sleeper()).await.unwrap();
    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Done);
    side.install(&unit, &service("ExecStart=/bin/sleep 2000"))
        .await
        .unwrap();
    assert!(side.details(&unit).await.unwrap().need_daemon_reload);
    side.reload().await.unwrap();
    assert!(!side.details(&unit).await.unwrap().need_daemon_reload);
    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::Done);
    side.uninstall(&unit).await.unwrap();
}

async fn a_failing_start_leaves_the_unit_failed_until_uninstalled<S: Side>(side: &S) {
    let unit = name("contract-fails.service");
    side.install(&unit, &service("Type=oneshot\nExecStart=/bin/false"))
        .await
        .unwrap();
    side.will_fail_to_start(&unit);
    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Failed);
    assert_eq!(state(side, &unit).await.1, "failed");
    // Why, as the agent logs it: the service's Result and its main process's exit status.
    let details = side.details(&unit).await.unwrap();
    assert_eq!(details.result.as_deref(), Some("exit-code"));
    assert_eq!(details.main_exit, Some(MainExit::Exited(1)));
    side.uninstall(&unit).await.unwrap();
    assert_eq!(state(side, &unit).await.1, "inactive");
}

/// What the agent reads of a unit whose state changed (issue 41): systemd's restarts, when it
/// entered its state, its Result and its main process's exit (none while one runs).
async fn reads_what_systemd_did_to_a_unit<S: Side>(side: &S) {
    let unit = name("contract-facts.service");
    side.install(&unit, &sleeper()).await.unwrap();
    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Done);
    let running = side.facts(&unit).await.unwrap();
    assert_eq!(
        (
            running.n_restarts,
            running.main_exit,
            running.result.as_deref()
        ),
        (0, None, Some("success"))
    );
    assert!(running.since.is_some(), "{running:?}");
    // What the agent reads alone of a unit it started afresh and finds active.
    assert_eq!(side.since(&unit).await.unwrap(), running.since);
    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::Done);
    side.uninstall(&unit).await.unwrap();
    let failing = name("contract-facts-fails.service");
    side.install(&failing, &service("Type=oneshot\nExecStart=/bin/false"))
        .await
        .unwrap();
    side.will_fail_to_start(&failing);
    assert_eq!(side.start(&failing).await.unwrap(), JobOutcome::Failed);
    let failed = side.facts(&failing).await.unwrap();
    assert_eq!(failed.result.as_deref(), Some("exit-code"));
    assert_eq!(failed.main_exit, Some(MainExit::Exited(1)));
    assert!(failed.since.is_some(), "{failed:?}");
    side.uninstall(&failing).await.unwrap();
}

async fn reports_unparseable_files_and_skips_names_that_are_not_units<S: Side>(side: &S) {
    side.plant("contract-bad.service", b"[Service\nExecStart=/bin/true\n");
    side.plant("README", b"not a unit");
    let installed = side.installed().await.unwrap();
    let names: Vec<String> = installed.iter().map(|u| u.name.to_string()).collect();
    assert_eq!(names, ["contract-bad.service"]);
    assert!(installed[0].content.is_err());
    assert!(!installed[0].linked);
    let bad = name("contract-bad.service");
    let some = side.installed_of(std::slice::from_ref(&bad)).await.unwrap();
    assert_eq!(some.len(), 1);
    assert!(some[0].content.is_err());
}

async fn hints_a_unit_after_its_job_and_starts_with_a_resync<S: Side>(side: &S) {
    let mut changes = side.changes();
    let first = tokio::time::timeout(Duration::from_secs(5), changes.recv()).await;
    assert_eq!(first.ok().flatten(), Some(Change::Resync));
    let unit = name("contract-hints.service");
    side.install(&unit, &sleeper()).await.unwrap();
    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Done);
    let hinted = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match changes.recv().await {
                // A resync covers every unit: hints are coalesced into it.
                Some(Change::Resync) => return true,
                Some(Change::Units(units)) if units.contains(&unit) => return true,
                Some(Change::Units(_)) => continue,
                None => return false,
            }
        }
    })
    .await;
    assert_eq!(hinted, Ok(true), "no hint named {unit}");
    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::Done);
    side.uninstall(&unit).await.unwrap();
}

async fn tells_fleets_units_from_an_operators_of_the_same_name<S: Side>(side: &S) {
    let ours = name("contract-source-ours.service");
    side.install(&ours, &sleeper()).await.unwrap();
    assert_eq!(side.source(&ours).await.unwrap(), UnitSource::UnitsDir);
    let unknown = name("contract-source-unknown.service");
    assert_eq!(side.source(&unknown).await.unwrap(), UnitSource::NoFile);
    let operator = name("contract-source-operator.service");
    side.plant_operator_unit(&operator, &sleeper());
    let source = side.source(&operator).await.unwrap();
    assert!(matches!(source, UnitSource::Foreign { .. }), "{source:?}");
    side.uninstall(&ours).await.unwrap();
}

async fn uninstalls_many_units_at_once<S: Side>(side: &S) {
    // The real side disables units that arrive together in one call; a name systemd does not
    // know makes that call fail, and each unit must still get its own answer.
    let units: Vec<UnitName> = (0..20)
        .map(|i| name(&format!("contract-many-{i}.service")))
        .collect();
    for unit in &units {
        side.install(unit, &sleeper()).await.unwrap();
    }
    let started = futures::future::join_all(units[..10].iter().map(|u| side.start(u))).await;
    assert!(
        started.iter().all(|r| matches!(r, Ok(JobOutcome::Done))),
        "{started:?}"
    );
    let stopped = futures::future::join_all(units[..10].iter().map(|u| side.stop(u))).await;
    assert!(
        stopped.iter().all(|r| matches!(r, Ok(JobOutcome::Done))),
        "{stopped:?}"
    );
    let never = name("contract-many-never-installed.service");
    let all: Vec<&UnitName> = units.iter().chain([&never]).collect();
    let gone = futures::future::join_all(all.iter().map(|u| side.uninstall(u))).await;
    assert!(gone.iter().all(Result::is_ok), "{gone:?}");
    let left = side.installed_of(&units).await.unwrap();
    assert!(left.is_empty(), "{left:?}");
    for unit in &units {
        assert_eq!(state(side, unit).await.0, "not-found", "{unit}");
    }
}

async fn tells_which_units_systemd_holds<S: Side>(side: &S) {
    let unit = name("contract-held.service");
    let never = name("contract-held-never.service");
    let both = [unit.clone(), never.clone()];
    side.install(&unit, &sleeper()).await.unwrap();
    assert_eq!(side.start(&unit).await.unwrap(), JobOutcome::Done);
    let held = side.loaded(&both).await.unwrap();
    assert_eq!(held, BTreeSet::from([unit.clone()]), "asking loads nothing");
    assert_eq!(side.stop(&unit).await.unwrap(), JobOutcome::Done);
    side.uninstall(&unit).await.unwrap();
    // systemd frees a stopped unit from its garbage-collection queue, soon after the stop.
    let mut held = side.loaded(&both).await.unwrap();
    for _ in 0..100 {
        if held.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = side.loaded(&both).await.unwrap();
    }
    assert!(held.is_empty(), "{held:?}");
}

// ---- the two sides -----------------------------------------------------------------------------

/// Every body once, on the fake (`fake::<body>`) and inside a machine (`inside::<body>`).
macro_rules! contract {
    ($($body:ident),* $(,)?) => {
        mod fake {
            $(
                #[tokio::test]
                async fn $body() {
                    super::$body(&fleet_agent::FakeManager::new()).await;
                }
            )*
        }

        mod inside {
            $(
                #[test]
                #[ignore = "runs inside a test machine, started by real_systemd_keeps_the_contract"]
                fn $body() {
                    super::on_real_systemd(stringify!($body), |side| async move {
                        super::$body(&side).await;
                    });
                }
            )*
        }

        const BODIES: &[&str] = &[$(stringify!($body)),*];
    };
}

contract!(
    installs_starts_stops_and_uninstalls_a_unit,
    stopping_a_unit_systemd_does_not_have_is_not_loaded,
    starting_a_unit_without_a_file_fails_with_no_such_unit,
    a_changed_loaded_unit_runs_its_old_file_until_a_reload,
    a_failing_start_leaves_the_unit_failed_until_uninstalled,
    reports_unparseable_files_and_skips_names_that_are_not_units,
    hints_a_unit_after_its_job_and_starts_with_a_resync,
    tells_fleets_units_from_an_operators_of_the_same_name,
    uninstalls_many_units_at_once,
    tells_which_units_systemd_holds,
    reads_what_systemd_did_to_a_unit,
);

/// Set in the environment of the copies of this binary that run inside a machine.
const INSIDE: &str = "FLEET_CONTRACT_INSIDE";

/// Runs `body` on a [`SystemdManager`] with a units directory of its own, inside a machine.
fn on_real_systemd<F, Fut>(body_name: &str, body: F)
where
    F: FnOnce(SystemdManager) -> Fut,
    Fut: Future<Output = ()>,
{
    assert!(
        std::env::var_os(INSIDE).is_some(),
        "inside::{body_name} only runs inside a test machine (real_systemd_keeps_the_contract)"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = PathBuf::from(format!("/run/fleet-contract/{body_name}"));
        let config = SystemdConfig {
            units_dir: dir.clone(),
            ..SystemdConfig::default()
        };
        REAL_UNITS_DIR.set(dir).unwrap();
        body(SystemdManager::connect(config).await.unwrap()).await;
    });
}

#[test]
fn real_systemd_keeps_the_contract() -> anyhow::Result<()> {
    use anyhow::Context;
    use fleet_functional_tests::{Cluster, ClusterSpec, MACHINE_BIN_DIR, cleanup_stale};
    cleanup_stale()?;
    let exe = std::env::current_exe()?;
    let exe_name = exe.file_name().context("no executable name")?;
    // The machine sees the host's bin dir (<target>/debug) at MACHINE_BIN_DIR; test binaries
    // are in its deps/.
    let deps = exe.parent().context("no executable dir")?;
    let spec = ClusterSpec {
        bin_dir: Some(
            deps.parent()
                .context("not in <target>/debug/deps")?
                .to_path_buf(),
        ),
        ..ClusterSpec::bare(1)
    };
    let cluster = Cluster::start(spec)?;
    let machine = &cluster.machines()[0];
    let inside_exe = format!("{MACHINE_BIN_DIR}/deps/{}", exe_name.to_string_lossy());
    let mut failed = Vec::new();
    for body in BODIES {
        let out = machine.exec(
            "env",
            [
                &format!("{INSIDE}=1"),
                inside_exe.as_str(),
                "--ignored",
                "--exact",
                &format!("inside::{body}"),
                "--nocapture",
                "--test-threads=1",
            ],
        )?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() || !text.contains("1 passed") {
            failed.push(format!("inside::{body}:\n{text}"));
        }
    }
    assert!(
        failed.is_empty(),
        "the real systemd broke the contract:\n{}",
        failed.join("\n")
    );
    Ok(())
}
