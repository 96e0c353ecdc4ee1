//! fleetctl's blocking commands as a new user meets them (issue 16, first contact), end to end
//! against a real etcd, over either driver (`FLEETCTL_TEST_DRIVER`, `over/mod.rs`): a unit no
//! machine can take is reported with the engine's grouped reason (the scheduler's, published
//! here as the engine publishes it, on a thread of its own), Ctrl-C says what stays and exits
//! 130, and running the same blocking command again waits for the state it promises instead
//! of returning at once.

mod over;

use fleet_core::{DesiredState, MachineId, MachineInfo, UnitFile, UnitName};
use fleet_registry::kv::EtcdKv;
use fleet_registry::{DEFAULT_PREFIX, Registry, ScheduleEntry};
use fleet_testing::{TestEtcd, machine_running};
use over::Over;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const HELLO: &str = "[Service]\nExecStart=/bin/sleep 1000\n";
const NOWHERE: &str =
    "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nMachineMetadata=nothing=here\n";
/// Machines register for longer than any test runs.
const TTL: Duration = Duration::from_secs(600);

struct Env {
    etcd: TestEtcd,
    dir: PathBuf,
    over: Over,
}

impl Env {
    async fn new(test: &str) -> Env {
        let etcd = TestEtcd::start().await;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("fleetctl-blocking")
            .join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("hello.service"), HELLO).unwrap();
        std::fs::write(dir.join("nowhere.service"), NOWHERE).unwrap();
        let over = Over::chosen(&etcd);
        Env { etcd, dir, over }
    }

    async fn registry(&self) -> Registry<EtcdKv> {
        Registry::new(self.etcd.kv().await, DEFAULT_PREFIX)
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        self.over.apply(&mut cmd, &self.etcd.endpoint());
        cmd.args(args).current_dir(&self.dir);
        cmd
    }

    fn fleetctl(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }
}

/// The engine's part in these tests, played over the test etcd on a thread with its own
/// runtime (the tests block on fleetctl): every 200 ms it plans the registry as it is with the
/// engine's scheduler (fleet-scheduler) and writes the unscheduled reasons the plan
/// publishes, at the key and in the form the engine writes them. fleetctl depends on neither
/// the engine nor its leadership; fleet-engine's tests and the functional tests cover the
/// engine publishing the same reasons. Stopped when dropped.
struct Engine {
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    fn start(etcd: &TestEtcd) -> Engine {
        let config = etcd.config();
        let (stop, mut shutdown) = tokio::sync::watch::channel(false);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let kv = EtcdKv::connect(&config).await.unwrap();
                let registry = Registry::new(kv, DEFAULT_PREFIX);
                loop {
                    publish_reasons(&registry).await;
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        () = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            });
        });
        Engine {
            stop,
            thread: Some(thread),
        }
    }
}

/// One pass of [`Engine`]: the plan's new unscheduled reasons, written.
async fn publish_reasons(registry: &Registry<EtcdKv>) {
    let snapshot = registry.snapshot().await.unwrap();
    let files = registry.files(None).await.unwrap().items;
    for decision in fleet_scheduler::plan(&snapshot, &files).decisions {
        if let fleet_scheduler::DecisionKind::Unschedulable { unit } = &decision.kind {
            let key = registry.keys().unscheduled(unit);
            registry.put_raw(&key, &decision.reason.to_string()).await;
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A 32-character machine ID made of `c`.
fn id(c: char) -> MachineId {
    c.to_string().repeat(32).parse().unwrap()
}

fn info(c: char) -> MachineInfo {
    MachineInfo {
        id: id(c),
        public_ip: "10.0.0.1".into(),
        metadata: [("role".to_owned(), "web".to_owned())].into(),
        version: "test".into(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    }
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn a_unit_no_machine_can_take_is_reported_grouped_and_ctrl_c_says_it_stays() {
    let env = Env::new("nowhere").await;
    let registry = env.registry().await;
    for c in ['a', 'b', 'c'] {
        machine_running(&registry, &info(c), TTL, &[]).await;
    }
    let _engine = Engine::start(&env.etcd);
    let reason = "Unit nowhere.service cannot be scheduled yet: no machine able to run unit: \
                  3 machines lack nothing=here\n";

    let o = env.fleetctl(&["start", "--block-attempts", "3", "nowhere.service"]);
    assert!(!o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        format!("{reason}Timed out waiting for units: nowhere.service\n")
    );

    // Again: the unit is already desired launched, and it is still waited for.
    let o = env.fleetctl(&["start", "--block-attempts", "1", "nowhere.service"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(
        stderr(&o),
        format!("{reason}Timed out waiting for units: nowhere.service\n")
    );
    let o = env.fleetctl(&["start", "--no-block", "nowhere.service"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!((stdout(&o), stderr(&o)), (String::new(), String::new()));

    // Ctrl-C once it waits: what stays, how to undo it, exit 130.
    let mut child = env
        .command(&["start", "nowhere.service"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a line on stderr").unwrap();
    assert_eq!(format!("{first}\n"), reason);
    let pid = child.id().to_string();
    let sent = Command::new("bash")
        .args(["-c", "kill -INT \"$1\"", "kill", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{rest:?}");
    assert_eq!(
        rest,
        [
            "Interrupted: stopped waiting; what was asked stays asked.",
            "Unit nowhere.service stays in the cluster with desired state launched: the \
             cluster goes on working towards it.",
            "To undo: `fleetctl stop nowhere.service` (keeps it loaded) or \
             `fleetctl destroy nowhere.service` (removes it).",
        ]
    );
    let o = env.fleetctl(&["list-unit-files", "--no-legend", "--fields", "unit,dstate"]);
    assert_eq!(stdout(&o), "nowhere.service\tlaunched\n");
}

#[tokio::test]
async fn a_rerun_start_or_stop_waits_for_the_state_it_promises() {
    let env = Env::new("rerun").await;
    let o = env.fleetctl(&["start", "--no-block", "hello.service"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(stdout(&o), "Triggered unit hello.service start\n");

    // Desired launched already, running nowhere: a blocking start waits, and says so.
    let o = env.fleetctl(&["start", "--block-attempts", "1", "hello.service"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(stderr(&o), "Timed out waiting for units: hello.service\n");

    // Once a machine runs it, the same command reports it there.
    let registry = env.registry().await;
    let file = UnitFile::parse(HELLO.as_bytes()).unwrap();
    let entry = ScheduleEntry {
        name: name("hello.service"),
        machine: id('a'),
        hash: file.hash(),
        desired: DesiredState::Launched,
        restart: 0,
        no_restart: false,
        placement: 0,
    };
    registry.write_schedule(&[entry], &[]).await.unwrap();
    machine_running(
        &registry,
        &info('a'),
        TTL,
        &[(name("hello.service"), file.hash(), true)],
    )
    .await;
    let o = env.fleetctl(&["start", "hello.service"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        stdout(&o),
        "Unit hello.service launched on aaaaaaaa.../10.0.0.1\n"
    );
    assert_eq!(stderr(&o), "");

    // A stop waits for the machine to stop it, and so does the same stop again (the
    // registry already says loaded; the machine still runs it).
    for _ in 0..2 {
        let o = env.fleetctl(&["stop", "--block-attempts", "1", "hello.service"]);
        assert_eq!(o.status.code(), Some(1), "{o:?}");
        assert_eq!(stderr(&o), "Timed out waiting for units: hello.service\n");
    }
    let o = env.fleetctl(&["stop", "--no-block", "hello.service"]);
    assert_eq!((stdout(&o), stderr(&o)), (String::new(), String::new()));
}

/// On a terminal (a pseudo-terminal from `script`, bsdutils), a wait on several units shows
/// its progress on stderr; the piped runs above show none (their stderr is exact).
#[tokio::test]
async fn on_a_terminal_a_wait_on_several_units_shows_its_progress() {
    let env = Env::new("progress").await;
    let mut cmd = Command::new("script");
    // script runs one command line through $SHELL: fleetctl's path and endpoint go in the
    // environment, not into the quoting.
    cmd.args([
        "-q",
        "-e",
        "-c",
        "exec \"$FLEETCTL_BIN\" start --block-attempts 2 hello.service nowhere.service",
        "/dev/null",
    ])
    .env("FLEETCTL_BIN", env!("CARGO_BIN_EXE_fleetctl"))
    .env("SHELL", "/bin/bash")
    .env("TERM", "xterm")
    .stdin(Stdio::null())
    .current_dir(&env.dir);
    env.over.env(&mut cmd, &env.etcd.endpoint());
    let o = cmd.output().unwrap();
    let all = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(
        // The line is cut at the terminal's width (80 columns here).
        all.contains("] 0/2 units done, 0s; slowest: hello.service (not scheduled"),
        "{all:?}"
    );
    assert!(
        all.contains("0/2 units done, 1s"),
        "the clock moves: {all:?}"
    );
    assert!(
        all.contains("Timed out waiting for units: hello.service, nowhere.service"),
        "{all:?}"
    );
}
