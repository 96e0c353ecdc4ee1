//! The Debian package of issue 18, built by `make package` from the workspace's debug
//! binaries and installed, upgraded and purged with dpkg inside a machine whose root is an
//! overlay over the host's (`ClusterSpec::writable_root`): dpkg writes only into that
//! machine's tmpfs, never the host. The machine has no harness-made fleetd: everything it
//! runs of fleet comes from the package (docs/deploy.md).
//!
//! `make install` is checked on its own first, into a staging directory. The package tests
//! share one pair of packages (the same files as versions `-1` and `-2`, the
//! second standing for a rebuilt package), built once per run, gzip-compressed to be quick.

mod support;

use anyhow::{Context, Result, anyhow, ensure};
use fleet_functional_tests::{Cluster, ClusterSpec, Machine, OutputExt, cleanup_stale, wait_for};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use support::{TIMEOUT, finish, fleetctl_ok, sleeper, write_units};

/// The two builds: `first` installed, `second` the upgrade.
#[derive(Debug)]
struct Debs {
    first: PathBuf,
    second: PathBuf,
    /// lintian's report of `first` (warnings; an error fails the build).
    lintian: String,
}

const FIRST: &str = "0.0.0+test-1";
const SECOND: &str = "0.0.0+test-2";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

/// `make package` of the debug binaries; the .deb's path and what it wrote to stderr.
fn make_package(dir: &Path, version: &str, lintian: bool) -> Result<(PathBuf, String)> {
    let bin_dir = fleet_functional_tests::default_bin_dir();
    let out = Command::new("make")
        .arg("--no-print-directory")
        .arg("-C")
        .arg(workspace())
        .arg("package")
        .arg(format!("BIN_DIR={}", bin_dir.display()))
        .arg(format!("PACKAGE_DIR={}", dir.display()))
        .arg(format!("DEB_VERSION={version}"))
        .env("DEB_COMPRESS", "gzip")
        .env("LINTIAN", if lintian { "yes" } else { "no" })
        .output()
        .context("cannot run make package")?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = out
        .checked()
        .with_context(|| format!("make package: {stderr}"))?;
    let deb = stdout
        .lines()
        .last()
        .context("make package printed no path")?;
    Ok((PathBuf::from(deb), stderr))
}

fn debs() -> Result<&'static Debs> {
    static DEBS: OnceLock<Result<Debs, String>> = OnceLock::new();
    DEBS.get_or_init(|| {
        let build = || -> Result<Debs> {
            // One place per target directory, overwritten by each run.
            let dir = fleet_functional_tests::functional_dir().join("package");
            let (first, lintian) = make_package(&dir, FIRST, true)?;
            let (second, _) = make_package(&dir, SECOND, false)?;
            Ok(Debs {
                first,
                second,
                lintian,
            })
        };
        build().map_err(|e| format!("{e:#}"))
    })
    .as_ref()
    .map_err(|e| anyhow!("{e}"))
}

fn deb_field(deb: &Path, field: &str) -> Result<String> {
    let out = Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .arg(field)
        .output()?;
    out.checked().map(|s| s.trim().to_owned())
}

#[test]
fn the_package_builds_states_its_dependencies_and_lintian_reports_no_error() -> Result<()> {
    let debs = debs()?;
    // `make package` fails on a lintian error; this says so in the test's words too.
    ensure!(
        !debs.lintian.lines().any(|l| l.starts_with("E: ")),
        "lintian errors: {}",
        debs.lintian
    );
    let depends = deb_field(&debs.first, "Depends")?;
    ensure!(depends.split(", ").any(|d| d == "systemd"), "{depends}");
    ensure!(depends.contains("libc6"), "{depends}");
    let suggests = deb_field(&debs.first, "Suggests")?;
    ensure!(suggests.contains("etcd-server"), "{suggests}");
    // What lintian once said of this package (issue 38), each fixed: a socket under the
    // legacy /var/run, no md5sums; and the md5sums must agree with the files.
    for tag in [
        "systemd-service-file-refers-to-var-run",
        "no-md5sums-control-file",
        "md5sums-lists-nonexistent-file",
        "file-missing-in-md5sums",
        "md5sum-mismatch",
    ] {
        ensure!(
            !debs.lintian.contains(tag),
            "lintian says {tag}: {}",
            debs.lintian
        );
    }
    ensure!(
        debs.lintian.lines().any(|l| l.starts_with("I: ")),
        "make package no longer shows lintian's information tags, which the check above needs: {}",
        debs.lintian
    );
    let contents = Command::new("dpkg-deb")
        .arg("--contents")
        .arg(&debs.first)
        .output()?
        .checked()?;
    for path in [
        "./usr/bin/fleetd",
        "./usr/bin/fleetctl",
        "./lib/systemd/system/fleet.service",
        "./lib/systemd/system/fleet.socket",
        "./etc/fleet/fleet.conf.sample",
        "./usr/share/man/man8/fleetd.8.gz",
        "./usr/share/man/man1/fleetctl-start.1.gz",
        "./usr/share/bash-completion/completions/fleetctl",
        "./usr/share/zsh/vendor-completions/_fleetd",
        "./usr/share/fish/vendor_completions.d/fleetctl.fish",
        "./usr/share/doc/fleet/copyright",
        "./usr/share/doc/fleet/changelog.Debian.gz",
        "./usr/share/doc/fleet/README.md.gz",
    ] {
        ensure!(
            contents.contains(path),
            "no {path} in the package: {contents}"
        );
    }
    // Every document of docs/, where the README's links lead, compressed when over 4 kB.
    for entry in std::fs::read_dir(workspace().join("docs"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let path = format!("./usr/share/doc/fleet/docs/{name}");
        ensure!(
            contents.contains(&format!("{path}\n")) || contents.contains(&format!("{path}.gz\n")),
            "no {path}(.gz) in the package: {contents}"
        );
    }
    let md5sums = Command::new("dpkg-deb")
        .arg("--info")
        .arg(&debs.first)
        .arg("md5sums")
        .output()?
        .checked()
        .context("the package has no md5sums")?;
    ensure!(md5sums.contains("  usr/bin/fleetd\n"), "{md5sums}");
    // Conffiles are dpkg's to sum, as dh_md5sums leaves them out.
    ensure!(!md5sums.contains("etc/fleet"), "{md5sums}");
    let socket = Command::new("sh")
        .arg("-c")
        .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -xO ./lib/systemd/system/fleet.socket")
        .arg("sh")
        .arg(&debs.first)
        .output()?
        .checked()?;
    ensure!(
        socket.contains("\nListenStream=/run/fleet.sock\n"),
        "{socket}"
    );
    Ok(())
}

/// `make TARGET DESTDIR=dest PREFIX=/opt/fleet-test` of the debug binaries.
fn make_install(target: &str, dest: &Path) -> Result<String> {
    let out = Command::new("make")
        .arg("--no-print-directory")
        .arg("-C")
        .arg(workspace())
        .arg(target)
        .arg(format!("DESTDIR={}", dest.display()))
        .arg("PREFIX=/opt/fleet-test")
        .arg("SYSCONFDIR=/opt/fleet-test/etc")
        .arg(format!(
            "BIN_DIR={}",
            fleet_functional_tests::default_bin_dir().display()
        ))
        .output()
        .context("cannot run make")?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    out.checked()
        .with_context(|| format!("make {target}: {stderr}"))
}

/// Every file below `dir`, relative to it.
fn files_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn make_install_puts_the_files_under_prefix_with_their_paths_and_uninstall_takes_them_back()
-> Result<()> {
    let dest =
        fleet_functional_tests::functional_dir().join(format!("install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dest);
    make_install("install", &dest)?;
    let root = dest.join("opt/fleet-test");
    let files = files_below(&root);
    for file in [
        "bin/fleetd",
        "bin/fleetctl",
        "lib/systemd/system/fleet.service",
        "lib/systemd/system/fleet.socket",
        "etc/fleet/fleet.conf.sample",
        "share/man/man8/fleetd.8.gz",
        "share/man/man1/fleetctl.1.gz",
        "share/man/man1/fleetctl-list-units.1.gz",
        "share/bash-completion/completions/fleetd",
        "share/zsh/site-functions/_fleetctl",
        "share/fish/vendor_completions.d/fleetctl.fish",
    ] {
        ensure!(files.iter().any(|f| f == file), "no {file} in {files:?}");
    }
    let unit = std::fs::read_to_string(root.join("lib/systemd/system/fleet.service"))?;
    ensure!(
        unit.contains("ExecStart=/opt/fleet-test/bin/fleetd\n"),
        "{unit}"
    );
    ensure!(
        unit.contains("EnvironmentFile=-/opt/fleet-test/etc/fleet/fleetd.env"),
        "{unit}"
    );
    let sample = std::fs::read_to_string(root.join("etc/fleet/fleet.conf.sample"))?;
    ensure!(sample.contains("#etcd_servers="), "{sample}");
    make_install("uninstall", &dest)?;
    let left = files_below(&dest);
    ensure!(left.is_empty(), "make uninstall left {left:?}");
    std::fs::remove_dir_all(&dest)?;
    Ok(())
}

/// `dpkg args...` inside the machine, requiring success; its output.
fn dpkg(machine: &Machine, args: &[&str]) -> Result<String> {
    machine
        .exec("dpkg", args)?
        .checked()
        .with_context(|| format!("in machine {}: dpkg {}", machine.name(), args.join(" ")))
}

/// The unit's MainPID once it runs.
fn wait_main_pid(machine: &Machine, unit: &str) -> Result<u32> {
    let mut pid = None;
    wait_for(TIMEOUT, support::POLL, || {
        pid = machine.main_pid(unit).ok().flatten();
        pid.is_some()
    })
    .with_context(|| format!("{unit} did not start on {}", machine.name()))?;
    pid.context("no MainPID")
}

#[test]
fn a_machine_runs_a_unit_through_the_package_keeps_it_across_an_upgrade_and_purges_clean()
-> Result<()> {
    let debs = debs()?;
    cleanup_stale()?;
    let cluster = Cluster::start(ClusterSpec {
        writable_root: true,
        ..ClusterSpec::bare(1)
    })?;
    let machine = &cluster.machines()[0];
    // The host is a container image whose policy-rc.d forbids maintainer scripts to start
    // services; a real host has none. Removed in the machine's overlay only.
    machine.sh("rm -f /usr/sbin/policy-rc.d")?;
    machine.write_file("/var/tmp/fleet-1.deb", std::fs::read(&debs.first)?)?;
    machine.write_file("/var/tmp/fleet-2.deb", std::fs::read(&debs.second)?)?;

    // Installed: enabled, but waiting for /etc/fleet/fleet.conf.
    dpkg(machine, &["-i", "/var/tmp/fleet-1.deb"])?;
    for unit in ["fleet.service", "fleet.socket"] {
        let enabled = machine.systemctl(["is-enabled", unit])?.stdout_text();
        ensure!(enabled.trim() == "enabled", "{unit} is {enabled:?}");
        let active = machine.systemctl(["is-active", unit])?.stdout_text();
        ensure!(
            active.trim() == "inactive",
            "{unit} is {active:?} before fleet.conf"
        );
    }
    machine.sh("getent group fleet")?;
    // Every file as packaged (md5sums checked; conffiles by their own sums).
    let verify = machine.sh("test -s /var/lib/dpkg/info/fleet.md5sums && dpkg --verify fleet")?;
    ensure!(verify.trim().is_empty(), "dpkg --verify: {verify}");
    let files = dpkg(machine, &["-L", "fleet"])?;
    let conffiles = machine.sh("dpkg-query -W -f='${Conffiles}' fleet")?;
    ensure!(
        conffiles.contains("/etc/fleet/fleet.conf.sample"),
        "{conffiles}"
    );

    // Configured through fleet.conf, started through the packaged units.
    let conf = format!(
        "etcd_servers={}\npublic_ip={}\nmetadata=hostname={}\nagent_ttl=3s\n",
        cluster.etcd_endpoint(),
        machine.ip(),
        machine.name()
    );
    machine.write_file("/etc/fleet/fleet.conf", conf)?;
    // Type=notify: returns once fleetd registered and reconciled once.
    machine.systemctl_ok(&["start", "fleet.service"])?;
    // systemd listens on /run/fleet.sock without rewriting a legacy /var/run path (which
    // systemd 252 says at debug level only, hence the verify at that level); fleetctl's
    // default /var/run/fleet.sock is the same file.
    let listen = machine.sh("systemctl show -p Listen fleet.socket")?;
    ensure!(listen.contains("=/run/fleet.sock (Stream)"), "{listen}");
    let legacy = machine.sh(
        "SYSTEMD_LOG_LEVEL=debug systemd-analyze verify /lib/systemd/system/fleet.socket 2>&1 \
         | grep 'legacy directory' || true",
    )?;
    ensure!(legacy.trim().is_empty(), "systemd: {legacy}");
    let socket = machine.sh("stat -L -c %G:%a /var/run/fleet.sock")?;
    ensure!(socket.trim() == "fleet:660", "the API socket is {socket:?}");
    let units = BTreeMap::from([("hello.service".to_owned(), sleeper(3600))]);
    let paths = write_units(&cluster.dir().join("units"), &units)?;
    fleetctl_ok(&cluster, &["start", &paths["hello.service"]])?;
    let unit_pid = wait_main_pid(machine, "hello.service")?;
    let fleetd_pid = wait_main_pid(machine, "fleet.service")?;

    // A rebuilt package: fleetd restarts, the unit does not, the edited conffile stays.
    machine.sh("echo '# edited' >>/etc/fleet/fleet.conf.sample")?;
    dpkg(machine, &["-i", "/var/tmp/fleet-2.deb"])?;
    let version = machine.sh("dpkg-query -W -f='${Version}' fleet")?;
    ensure!(version == SECOND, "installed {version:?}");
    let restarted = wait_main_pid(machine, "fleet.service")?;
    ensure!(
        restarted != fleetd_pid,
        "the upgrade did not restart fleetd"
    );
    ensure!(
        machine.main_pid("hello.service")? == Some(unit_pid),
        "the upgrade touched hello.service"
    );
    let sample = machine.read_file("/etc/fleet/fleet.conf.sample")?;
    ensure!(sample.ends_with("# edited\n"), "the conffile was replaced");
    ensure!(
        machine.read_file("/etc/fleet/fleet.conf").is_ok(),
        "fleet.conf is gone"
    );
    // Once the new fleetd has reconciled, the unit still has not moved.
    let status = fleetctl_ok(&cluster, &["list-units", "--no-legend"])?;
    ensure!(status.stdout.contains("hello.service"), "{}", status.stdout);
    ensure!(machine.main_pid("hello.service")? == Some(unit_pid));

    // Purged: none of its files, its conffiles or its units' links (its group stays); the unit
    // fleetd started was stopped by its fence (the engine would run it elsewhere), and no
    // fence is left armed. What the operator put in /etc/fleet stays: fleet.conf, and the
    // keys docs/deploy.md keeps there.
    machine.sh("mkdir -p /etc/fleet/tls && echo key >/etc/fleet/tls/api.key")?;
    dpkg(machine, &["--purge", "fleet"])?;
    let kept = machine.sh("cd /etc/fleet && find . -type f | sort")?;
    ensure!(
        kept == "./fleet.conf\n./tls/api.key\n",
        "after the purge /etc/fleet holds {kept:?}"
    );
    // Its directories the host has too (/usr/bin) stay, and /etc/fleet with the operator's
    // files (checked above); all else must be gone.
    let own: Vec<&str> = files
        .lines()
        .filter(|path| !matches!(*path, "/." | "/etc/fleet") && !Path::new(path).is_dir())
        .collect();
    machine.write_file("/var/tmp/fleet.files", own.join("\n") + "\n")?;
    let left = machine.sh(
        "while read -r p; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then echo \"$p\"; fi; done </var/tmp/fleet.files",
    )?;
    ensure!(left.trim().is_empty(), "purge left {left:?}");
    let dirs = machine.sh(
        "ls -d /usr/share/doc/fleet /lib/systemd/system/fleet.service.d \
         /etc/systemd/system/fleetd.service /etc/systemd/system/*/fleet.* 2>/dev/null || true",
    )?;
    ensure!(dirs.trim().is_empty(), "purge left {dirs:?}");
    // The group stays, as Debian leaves system groups (postrm says why).
    ensure!(
        machine.exec("getent", ["group", "fleet"])?.status.success(),
        "the purge deleted the group fleet"
    );
    let active = machine
        .systemctl(["is-active", "hello.service"])?
        .stdout_text();
    ensure!(
        matches!(active.trim(), "inactive" | "failed"),
        "the removal did not fence hello.service: {active:?}\n{}",
        machine.sh("journalctl -o cat | grep -i fence | tail -20")?
    );
    let fences = machine.sh("systemctl list-units --all --no-legend 'fleet-fence-*'")?;
    ensure!(fences.trim().is_empty(), "fences left: {fences:?}");
    finish(cluster)
}
