//! fleetd's lock on its runtime directory against the processes that hold it, on the real OS
//! (issue 36): another user's process that opened the lock file before fleetd made it private
//! cannot keep fleetd from starting, and a live fleetd of the same user still keeps a second
//! one out. These run `fleetd` itself with a configuration whose units directory is under
//! cargo's target directory and whose etcd is an unused loopback port (the client connects
//! lazily), with the system bus pointed at a socket that never answers: past its lock, fleetd
//! waits there, holding it, until the test kills it. Need root (for `setpriv`); skipped
//! otherwise.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
const WAIT: Duration = Duration::from_secs(20);

/// A test's directory under cargo's target directory (never /tmp), reachable by `nobody`.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("runtime-lock-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        Scratch(dir)
    }

    fn runtime_dir(&self) -> PathBuf {
        self.0.join("run")
    }

    fn lock(&self) -> PathBuf {
        self.runtime_dir().join("fleetd.lock")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Kills the process when dropped, so that a failed assertion leaves no holder behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn is_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap();
    uid == "0"
}

/// The PIDs that /proc/locks shows holding a `flock` on the file at `path` now.
fn flock_holders(path: &Path) -> Vec<u32> {
    let meta = fs::metadata(path).unwrap();
    let dev = meta.dev();
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    let id = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter_map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            (w.get(1) == Some(&"FLOCK") && w.get(5) == Some(&id.as_str()))
                .then(|| w[4].parse().ok())
                .flatten()
        })
        .collect()
}

/// Waits until `pid` holds a `flock` on `path`; panics with `why` after [`WAIT`].
fn wait_held_by(path: &Path, pid: u32, why: impl Fn() -> String) {
    let start = Instant::now();
    while !(path.exists() && flock_holders(path).contains(&pid)) {
        assert!(
            start.elapsed() < WAIT,
            "{} never held by pid {pid}: {}",
            path.display(),
            why()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `program args... -o LOCK cat`: a `flock` that holds `lock` (opened before it locks) until
/// its stdin closes, with `prefix` in front (`setpriv ...` to run it as another user).
fn hold(prefix: &[&str], flock: &Path, lock: &Path) -> Killed {
    let mut argv: Vec<std::ffi::OsString> = prefix.iter().map(Into::into).collect();
    argv.push(flock.into());
    argv.extend(["-o".into(), lock.into(), "cat".into()]);
    let child = spawn_retrying(
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::null()),
    );
    let pid = child.id();
    let holder = Killed(child);
    wait_held_by(lock, pid, || "the holder did not take the lock".into());
    holder
}

/// Spawns `cmd`, again while the program is busy: a freshly copied binary is "busy" while any
/// child forked by another test (before its exec) still holds the copy's write descriptor.
fn spawn_retrying(cmd: &mut Command) -> Child {
    let start = Instant::now();
    loop {
        match cmd.spawn() {
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy && start.elapsed() < WAIT =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
}

/// fleetd, started on the scratch directory's configuration; its stderr is read once it is
/// killed or exits.
struct Fleetd {
    child: Killed,
    /// Keeps the silent system bus open.
    _bus: UnixListener,
}

impl Fleetd {
    fn start(scratch: &Scratch) -> Fleetd {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = scratch.0.join("fleet.conf");
        fs::write(
            &conf,
            format!(
                "etcd_servers=http://127.0.0.1:{port}\nunits_directory={}\napi_socket=\n\
                 disable_engine=true\nlog_format=text\nlog_filter=info\n",
                scratch.runtime_dir().join("units").display()
            ),
        )
        .unwrap();
        let bus_path = scratch.0.join("bus.sock");
        let bus = UnixListener::bind(&bus_path).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetd"));
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FLEET_")) {
            cmd.env_remove(k);
        }
        let child = cmd
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("RUST_LOG")
            .env(
                "DBUS_SYSTEM_BUS_ADDRESS",
                format!("unix:path={}", bus_path.display()),
            )
            .args(["--config".as_ref(), conf.as_os_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Fleetd {
            child: Killed(child),
            _bus: bus,
        }
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Whether it has exited.
    fn exited(&mut self) -> bool {
        self.child.0.try_wait().unwrap().is_some()
    }

    /// Waits up to `wait` for it to exit, kills it if it has not, and returns its stderr.
    fn finish(mut self, wait: Duration) -> String {
        let start = Instant::now();
        while !self.exited() && start.elapsed() < wait {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
        let mut err = String::new();
        if let Some(mut stderr) = self.child.0.stderr.take() {
            stderr.read_to_string(&mut err).unwrap();
        }
        err
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn another_users_process_holding_a_lock_file_from_before_the_fix_is_taken_over() {
    if !is_root() {
        eprintln!("skipped: needs root for setpriv");
        return;
    }
    let scratch = Scratch::new("takeover");
    // As an older fleetd left them: 0755 and 0644, so that nobody can open the lock.
    let dir = scratch.runtime_dir();
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(scratch.lock(), "").unwrap();
    fs::set_permissions(scratch.lock(), fs::Permissions::from_mode(0o644)).unwrap();
    let old_ino = fs::metadata(scratch.lock()).unwrap().ino();
    let nobody = NOBODY.to_string();
    let (reuid, regid) = (format!("--reuid={nobody}"), format!("--regid={nobody}"));
    let squatter = hold(
        &["setpriv", &reuid, &regid, "--clear-groups"],
        Path::new("flock"),
        &scratch.lock(),
    );
    let squatter_pid = squatter.0.id();

    let mut fleetd = Fleetd::start(&scratch);
    let start = Instant::now();
    // The new lock file is fleetd's: it holds it while it waits for the bus.
    let fleetd_pid = fleetd.pid();
    while !(fs::metadata(scratch.lock()).is_ok_and(|m| m.ino() != old_ino)
        && flock_holders(&scratch.lock()).contains(&fleetd_pid))
    {
        if fleetd.exited() || start.elapsed() > WAIT {
            panic!(
                "fleetd did not take the lock over:\n{}",
                fleetd.finish(WAIT)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let meta = fs::metadata(scratch.lock()).unwrap();
    assert_eq!((meta.uid(), mode(&scratch.lock())), (0, 0o600));
    assert_eq!(mode(&dir), 0o700);
    // The squatter still runs, holding a file no path leads to.
    assert!(squatter_pid > 0 && Path::new(&format!("/proc/{squatter_pid}")).exists());

    let log = fleetd.finish(Duration::ZERO);
    let taken = log
        .lines()
        .find(|l| l.contains("taking it over"))
        .unwrap_or_else(|| panic!("no take-over logged:\n{log}"));
    assert!(taken.contains("ERROR"), "{taken}");
    for field in [
        format!("pid={squatter_pid}"),
        format!("uid={NOBODY}"),
        "flock".to_owned(),
        "reason=a process of another user".to_owned(),
    ] {
        assert!(taken.contains(&field), "{field} not in {taken}");
    }
    for old in ["old_mode=0755", "old_mode=0644"] {
        assert!(
            log.lines().any(|l| l.contains("WARN") && l.contains(old)),
            "no warning with {old}:\n{log}"
        );
    }
    assert!(!log.contains("already running"), "{log}");
}

#[test]
fn a_second_fleetd_of_the_same_user_is_refused_naming_the_first_ones_pid() {
    if !is_root() {
        eprintln!("skipped: needs root for setpriv");
        return;
    }
    let scratch = Scratch::new("second");
    // The first fleetd: `flock` under the name fleetd (what /proc/<pid>/exe shows is what
    // counts), holding the lock in a runtime directory as fleetd makes it.
    let dir = scratch.runtime_dir();
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(scratch.lock(), "").unwrap();
    fs::set_permissions(scratch.lock(), fs::Permissions::from_mode(0o600)).unwrap();
    let bin = scratch.0.join("bin");
    fs::create_dir(&bin).unwrap();
    let flock = which("flock");
    fs::copy(&flock, bin.join("fleetd")).unwrap();
    let first = hold(&[], &bin.join("fleetd"), &scratch.lock());
    let first_pid = first.0.id();
    let ino = fs::metadata(scratch.lock()).unwrap().ino();

    let log = Fleetd::start(&scratch).finish(WAIT);
    let last = log.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!(
            "another fleetd (pid {first_pid}) is already running with runtime directory {}",
            dir.display()
        )),
        "{log}"
    );
    assert!(!log.contains("taking it over"), "{log}");
    assert_eq!(fs::metadata(scratch.lock()).unwrap().ino(), ino);
    assert_eq!(flock_holders(&scratch.lock()), [first_pid]);
}

/// Where `program` is on `PATH`.
fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}
