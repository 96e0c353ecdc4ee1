//! Promise 4 of `docs/guarantees.md` for fleetctl: bad input is refused at the door with a
//! clear message and a non-zero exit, and changes nothing in etcd. Each case runs against a
//! registry that already holds units (so "nothing changed" means something) and compares every
//! key, value and revision before and after. The messages must be safe to print: no raw
//! control character from the input reaches the terminal.
//!
//! `cli.rs` has the first cases (a malformed line, a 1.4 MB file, a long line, MachineID with
//! Global, non-UTF-8, a space, a control character, a 10 KB name, bad flags); these are the
//! rest. Over TLS, the refusals of a server or a client that does not verify are here too.
//!
//! fleetctl runs over the etcd driver, or the API driver with `FLEETCTL_TEST_DRIVER=api`
//! (`over/mod.rs`); the cases about etcd's own connection settings run over etcd always.

mod over;

use fleet_registry::kv::{EtcdKv, Kv};
use fleet_testing::{TestCerts, TestEtcd};
use over::Over;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HELLO: &str = "[Service]\nExecStart=/bin/sleep 1000\n";

/// Every key, value and mod revision, and the store's revision.
type Dump = (i64, Vec<(String, Vec<u8>, i64)>);

struct Env {
    etcd: TestEtcd,
    dir: PathBuf,
    over: Over,
}

impl Env {
    /// An etcd holding `seeded.service`, and a scratch directory for unit files.
    async fn new(test: &str) -> Env {
        Env::with(TestEtcd::start().await, test).await
    }

    async fn with(etcd: TestEtcd, test: &str) -> Env {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("fleetctl-bad-input")
            .join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let over = Over::chosen(&etcd);
        let env = Env { etcd, dir, over };
        let seeded = env.write("seeded.service", HELLO);
        let o = env.fleetctl(&["submit", &seeded]);
        assert!(o.status.success(), "seeding: {}", stderr(&o));
        env
    }

    fn write(&self, name: &str, text: impl AsRef<[u8]>) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    /// fleetctl over the chosen driver to this etcd (over etcd: with its TLS files, if any).
    fn fleetctl(&self, args: &[&str]) -> Output {
        self.fleetctl_over(&self.over, args)
    }

    /// fleetctl over `over` to this etcd.
    fn fleetctl_over(&self, over: &Over, args: &[&str]) -> Output {
        self.fleetctl_over_within(over, "2", args)
    }

    /// fleetctl over `over` to this etcd, each request within `secs` seconds.
    fn fleetctl_over_within(&self, over: &Over, secs: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        over.apply(&mut cmd, &self.etcd.endpoint());
        cmd.args(["--request-timeout", secs]).current_dir(&self.dir);
        if !over.is_api() {
            cmd.args(self.etcd_tls_flags());
        }
        cmd.args(args).output().unwrap()
    }

    /// The flags giving this etcd's TLS files, if any.
    fn etcd_tls_flags(&self) -> Vec<String> {
        self.etcd.fleetctl_tls_flags()
    }

    /// fleetctl with exactly `args`, over the etcd driver whatever the chosen one: its
    /// callers test how fleetctl takes etcd's own connection flags.
    fn fleetctl_raw<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_fleetctl"))
            .args(args)
            .current_dir(&self.dir)
            .env_remove("FLEETCTL_ENDPOINT")
            // These tests run fleetctl against a test etcd, on a port of its own.
            .env("FLEETCTL_DRIVER", "etcd")
            .output()
            .unwrap()
    }

    async fn dump(&self) -> Dump {
        let kv: EtcdKv = self.etcd.kv().await;
        let res = kv.range("/", true, None).await.unwrap();
        // The events of the commands that did something (issue 41) are theirs to test.
        let kvs = res
            .kvs
            .into_iter()
            .filter(|kv| !kv.key.contains("/event/"))
            .map(|kv| (kv.key, kv.value, kv.mod_revision))
            .collect();
        (res.revision, kvs)
    }

    /// Runs every case: each must fail with its message and leave etcd exactly as it was.
    async fn refuses_all(&self, cases: &[(Vec<&str>, &str)]) {
        self.refuses_all_over(&self.over, cases).await;
    }

    /// [`refuses_all`](Self::refuses_all) over `over`.
    async fn refuses_all_over(&self, over: &Over, cases: &[(Vec<&str>, &str)]) {
        let before = self.dump().await;
        let mut failures = Vec::new();
        for (args, message) in cases {
            let o = self.fleetctl_over(over, args);
            if let Err(why) = refused(&o, message) {
                failures.push(format!("{args:?}: {why}"));
            }
            if self.dump().await != before {
                failures.push(format!("{args:?} changed etcd"));
                break;
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Non-zero exit, `message` on stderr, nothing on stdout, no raw control character.
fn refused(o: &Output, message: &str) -> Result<(), String> {
    let err = stderr(o);
    if o.status.success() {
        return Err(format!("exited 0; stdout {:?}", stdout(o)));
    }
    if !err.contains(message) {
        return Err(format!("stderr {err:?} lacks {message:?}"));
    }
    if !o.stdout.is_empty() {
        return Err(format!("printed {:?}", stdout(o)));
    }
    if err.chars().any(|c| c.is_control() && c != '\n') {
        return Err(format!("raw control character in {err:?}"));
    }
    Ok(())
}

#[tokio::test]
async fn invalid_names_and_name_tricks_are_refused_with_their_character_escaped() {
    let env = Env::new("names").await;
    let long = format!("{}.service", "a".repeat(249));
    assert_eq!(long.len(), 257);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["submit", "a\nb.service"],
            "invalid character '\\n' in unit name",
        ),
        (
            vec!["submit", "a\tb.service"],
            "invalid character '\\t' in unit name",
        ),
        (
            vec!["submit", "a\u{7f}b.service"],
            "invalid character '\\x7f' in unit name",
        ),
        (
            vec!["submit", "\u{1b}[31mred.service"],
            "invalid character '\\x1b' in unit name",
        ),
        (
            vec!["submit", "a\rb.service"],
            "invalid character '\\r' in unit name",
        ),
        (
            vec!["submit", "zero\u{200b}width.service"],
            "invalid character '\\u200b' in unit name",
        ),
        (
            vec!["submit", "ünit.service"],
            "invalid character 'ü' in unit name",
        ),
        (
            vec!["submit", "semi;colon.service"],
            "invalid character ';' in unit name",
        ),
        (
            vec!["submit", "$(reboot).service"],
            "invalid character '$' in unit name",
        ),
        (
            vec!["submit", "*.service"],
            "invalid character '*' in unit name",
        ),
        (
            vec!["submit", &long],
            "unit name exceeds maximum length (256)",
        ),
        (
            vec!["submit", ".service"],
            "unit name cannot be \".service\"",
        ),
        (vec!["submit", "/"], "invalid character '/' in unit name"),
        (
            vec!["submit", "x@y.mount"],
            "invalid unit type for template: \"mount\"",
        ),
        // A path names the unit by its last component: nothing by that name exists here.
        (
            vec!["submit", "../x.service"],
            "unable to find Unit(x.service) in Registry or on filesystem",
        ),
        (
            vec!["start", "--no-block", "../../etc/systemd/system/x.service"],
            "unable to find Unit(x.service) in Registry or on filesystem",
        ),
        (
            vec!["start", "--no-block", "web@.service"],
            "cannot activate template web@.service",
        ),
        (
            vec!["load", "--no-block", "a\nb"],
            "invalid character '\\n' in unit name",
        ),
        (
            vec!["stop", "--no-block", "a\u{1}b"],
            "invalid character '\\x01' in unit name",
        ),
        (
            vec!["unload", "--no-block", "a b"],
            "invalid character ' ' in unit name",
        ),
        (
            vec!["destroy", "a\u{7}"],
            "invalid character '\\a' in unit name",
        ),
        (
            vec!["cat", "a\u{1b}"],
            "invalid character '\\x1b' in unit name",
        ),
        (
            vec!["restart", "--no-block", "missing.service"],
            "missing.service",
        ),
        (
            vec!["stop", "--no-block", "missing.service"],
            "missing.service",
        ),
        (
            vec!["unload", "--no-block", "missing.service"],
            "missing.service",
        ),
    ];
    env.refuses_all(&cases).await;
}

#[tokio::test]
async fn a_path_argument_names_the_unit_by_its_last_component_only() {
    let env = Env::new("paths").await;
    let inside = env.write("sub/x.service", HELLO);
    assert!(inside.ends_with("/sub/x.service"));
    // `sub/../sub/x.service` is a path to an existing file: the unit is `x.service`.
    let o = env.fleetctl(&["submit", "sub/../sub/x.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Unit x.service inactive\n");
    let (_, kvs) = env.dump().await;
    for (key, _, _) in &kvs {
        assert!(!key.contains(".."), "a key with '..': {key}");
        assert!(!key.contains("sub/"), "a key with the path: {key}");
    }
    assert!(
        kvs.iter()
            .any(|(k, _, _)| k == "/_coreos.com/fleet/unit/x.service")
    );
}

/// Issue 38: `submit /dev/stdin` said "unable to find Unit(stdin.service)". The file named is
/// there; its name is no unit's, and fleetctl names a unit after its file: the message says so.
#[tokio::test]
async fn a_file_not_named_as_a_unit_is_refused_saying_why() {
    let env = Env::new("not-a-unit-name").await;
    env.write("hello", HELLO);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["submit", "/dev/stdin"],
            "\"/dev/stdin\" is not named as a unit file: fleetctl names a unit after its file, \
             and found no \"/dev/stdin.service\" and no Unit(stdin.service) in the Registry",
        ),
        (
            vec!["start", "--no-block", "hello"],
            "\"hello\" is not named as a unit file",
        ),
        // No such file at all: fleet's own message.
        (
            vec!["submit", "absent"],
            "unable to find Unit(absent.service) in Registry or on filesystem",
        ),
    ];
    env.refuses_all(&cases).await;
}

#[tokio::test]
async fn malformed_and_oversized_unit_files_are_refused() {
    let env = Env::new("files").await;
    let max = fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
    let one_over = format!("too large ({} bytes, max {max})", max + 1);
    let files: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "unterminated.service",
            b"[Service\nExecStart=/bin/true\n".to_vec(),
            "line 1: unterminated section header",
        ),
        (
            "garbage.service",
            b"[Service] x\nExecStart=/bin/true\n".to_vec(),
            "line 1: found garbage after section name \"Service\"",
        ),
        (
            // fleet's reader: a CRLF line ending in `\` continues nothing.
            "crlf-continued.service",
            b"[Service]\r\nExecStart=/bin/sh -c \\\r\n  'echo a'\r\n".to_vec(),
            "line 3: expected Name=Value, found \"'echo a'\"",
        ),
        (
            "noequals.service",
            b"[Service]\nExecStart=/bin/true\nUser".to_vec(),
            "line 3: expected Name=Value, found \"User\"",
        ),
        (
            "crlf-line.service",
            format!("[Service]\r\nExecStart=/bin/echo {}\r\n", "y".repeat(2100)).into_bytes(),
            "line 2 too long",
        ),
        (
            "over-etcd.service",
            format!(
                "[Service]\n{}",
                "Environment=A=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n".repeat(50_000)
            )
            .into_bytes(),
            "too large",
        ),
        (
            "one-over.service",
            {
                let mut t = b"[Service]\n".to_vec();
                while t.len() < max + 1 {
                    t.extend_from_slice(b"A=b\n");
                }
                t.truncate(max + 1);
                t
            },
            &one_over,
        ),
        (
            // Within the size limit, but its options as fleet's API carries them (the section
            // repeated on each) would not fit a request body: both drivers refuse it.
            "many-options.service",
            format!("[Service]\n{}", "A=\n".repeat(300_000)).into_bytes(),
            "too large in fleet's API form",
        ),
    ];
    let mut cases: Vec<(Vec<&str>, &str)> = Vec::new();
    let paths: Vec<String> = files
        .iter()
        .map(|(name, bytes, _)| env.write(name, bytes))
        .collect();
    for ((_, _, message), path) in files.iter().zip(&paths) {
        cases.push((vec!["submit", path.as_str()], message));
    }
    // The same refusals from the commands that submit on the way.
    cases.push((vec!["start", "--no-block", paths[0].as_str()], files[0].2));
    cases.push((vec!["load", "--no-block", paths[4].as_str()], files[4].2));
    // A directory, and devices: one that never ends, one that would wait for a keyboard.
    std::fs::create_dir_all(env.dir.join("dir.service")).unwrap();
    cases.push((
        vec!["submit", "dir.service"],
        "is a directory, not a unit file",
    ));
    std::os::unix::fs::symlink("/dev/zero", env.dir.join("zero.service")).unwrap();
    cases.push((vec!["submit", "zero.service"], "is a device or socket"));
    std::os::unix::fs::symlink("/dev/tty", env.dir.join("tty.service")).unwrap();
    cases.push((vec!["submit", "tty.service"], "is a device or socket"));
    env.refuses_all(&cases).await;
}

#[tokio::test]
async fn impossible_x_fleet_combinations_are_refused_with_fleets_messages() {
    let env = Env::new("xfleet").await;
    let combos = [
        (
            "id-peers",
            "MachineID=abc\nMachineOf=a.service",
            "MachineID cannot be used with MachineOf",
        ),
        (
            "id-conflicts",
            "MachineID=abc\nConflicts=a*",
            "MachineID cannot be used with Conflicts",
        ),
        (
            "id-replaces",
            "MachineID=abc\nReplaces=a.service",
            "MachineID cannot be used with Replaces",
        ),
        (
            "global-peers",
            "Global=true\nMachineOf=a.service",
            "Global cannot be used with MachineOf",
        ),
        (
            "global-replaces",
            "Global=true\nReplaces=a.service",
            "Global cannot be used with Replaces",
        ),
        (
            "conflicts-replaces",
            "Conflicts=a*\nReplaces=b.service",
            "Conflicts cannot be used with Replaces",
        ),
        (
            "peer-conflict",
            "MachineOf=db.service\nConflicts=d*",
            "unresolvable requirements: peer \"db.service\" matches conflict \"d*\"",
        ),
        (
            "peer-replace",
            "MachineOf=db.service\nReplaces=db.*",
            "unresolvable requirements: peer \"db.service\" matches replace \"db.*\"",
        ),
        (
            "alias-id-global",
            "X-ConditionMachineID=abc\nGlobal=true",
            "MachineID cannot be used with Global",
        ),
        (
            "self-peer-conflict",
            "MachineOf=%n\nConflicts=%p*",
            "unresolvable requirements: peer \"self-peer-conflict.service\" matches conflict \"self-peer-conflict*\"",
        ),
    ];
    let mut paths = Vec::new();
    for (name, options, _) in &combos {
        let text = format!("[Service]\nExecStart=/bin/true\n\n[X-Fleet]\n{options}\n");
        paths.push(env.write(&format!("{name}.service"), text));
    }
    let mut cases: Vec<(Vec<&str>, &str)> = combos
        .iter()
        .zip(&paths)
        .map(|((_, _, message), path)| (vec!["submit", path.as_str()], *message))
        .collect();
    cases.push((vec!["start", "--no-block", paths[1].as_str()], combos[1].2));
    env.refuses_all(&cases).await;
}

/// fleet warns about `[X-Fleet]` keys it does not know and goes on (issue 2 keeps that);
/// the warning names the key, and the unit is stored as given.
#[tokio::test]
async fn an_unknown_x_fleet_key_is_a_warning_naming_the_key() {
    let env = Env::new("unknown").await;
    let path = env.write(
        "typo.service",
        "[Service]\nExecStart=/bin/true\n\n[X-Fleet]\nMachineMetdata=region=us\n",
    );
    let o = env.fleetctl(&["submit", &path]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "WARNING: Unit typo.service: unrecognized requirement in [X-Fleet] section: \"MachineMetdata\""
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "Unit typo.service inactive\n");
}

#[tokio::test]
async fn unknown_commands_flags_and_fields_are_refused() {
    let env = Env::new("unknown-cli").await;
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (
            vec!["submit", "--replcae", "x.service"],
            "unexpected argument '--replcae'",
        ),
        (
            vec!["list-machines", "--fields", "machine,bogus"],
            "Invalid key in output format: \"bogus\"",
        ),
        (
            vec!["--driver", "grpc", "list-units"],
            "invalid value 'grpc' for '--driver <DRIVER>'\n  [possible values: api, etcd]",
        ),
    ];
    env.refuses_all(&cases).await;
    let before = env.dump().await;
    // Over etcd either way: the message is the etcd driver's, about its endpoint list.
    let o = env.fleetctl_raw(&["--endpoint", ",", "list-units"]);
    refused(&o, "no etcd endpoints configured").unwrap();
    assert_eq!(env.dump().await, before);
}

/// A file of many small sections, under the size limit as written: its canonical text (what
/// the registry stores) is longer. fleetctl must either refuse it or be able to read it back.
#[tokio::test]
async fn a_unit_file_accepted_near_the_size_limit_can_be_read_back() {
    let env = Env::new("near-limit").await;
    let max = fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
    let value = "v".repeat(400);
    let mut text = String::from("[Service]\nExecStart=/bin/sleep 1000\n");
    let mut i = 0;
    loop {
        let section = format!("[X-Pad{i}]\nA={value}\n");
        if text.len() + section.len() > max {
            break;
        }
        text.push_str(&section);
        i += 1;
    }
    let path = env.write("near.service", &text);
    let o = env.fleetctl(&["submit", &path]);
    if !o.status.success() {
        refused(&o, "too large").unwrap();
        return;
    }
    let cat = env.fleetctl(&["cat", "near.service"]);
    assert!(
        cat.status.success(),
        "BUG: fleetctl accepted a {} byte file but cannot read it back: {}",
        text.len(),
        stderr(&cat)
    );
    let listing = env.fleetctl(&["list-unit-files"]);
    assert!(listing.status.success(), "{}", stderr(&listing));
}

fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

/// Over etcd whatever the chosen driver (but the last, working command): the flags and
/// messages are the etcd driver's, for its TLS connection to etcd.
#[tokio::test]
async fn tls_flags_that_cannot_work_are_refused_before_anything_is_sent() {
    let certs = TestCerts::generate(&[loopback()]);
    let env = Env::with(TestEtcd::start_tls(&certs, loopback()).await, "tls-flags").await;
    let endpoint = env.etcd.endpoint();
    let http = endpoint.replace("https://", "http://");
    let (ca, cert, key) = (
        certs.ca().display().to_string(),
        certs.client_cert().display().to_string(),
        certs.client_key().display().to_string(),
    );
    let wrong_ca = certs.wrong_ca().display().to_string();
    let wrong_key = certs.wrong_client_key().display().to_string();
    let not_pem = env.write("not.pem", "hello\n");
    let mixed = format!("{endpoint},{http}");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--endpoint", &endpoint],
            "https etcd endpoints need a CA file",
        ),
        (
            vec!["--ca-file", "/nonexistent/ca.pem"],
            "cannot read /nonexistent/ca.pem",
        ),
        (vec!["--ca-file", &not_pem], "not.pem is not a PEM file"),
        (
            vec!["--ca-file", &ca, "--cert-file", &cert],
            "given without a key file",
        ),
        (
            vec!["--ca-file", &ca, "--key-file", &key],
            "given without a certificate file",
        ),
        (
            vec!["--endpoint", &mixed, "--ca-file", &ca],
            "etcd endpoints mix https and http",
        ),
        (
            vec![
                "--ca-file",
                &ca,
                "--cert-file",
                &cert,
                "--key-file",
                &wrong_key,
            ],
            "cannot be used (InconsistentKeys(KeyMismatch))",
        ),
        (
            vec![
                "--ca-file",
                &wrong_ca,
                "--cert-file",
                &cert,
                "--key-file",
                &key,
            ],
            "invalid peer certificate: UnknownIssuer",
        ),
        (
            vec!["--ca-file", &ca],
            "no TLS client certificate is configured",
        ),
    ];
    let before = env.dump().await;
    let mut failures = Vec::new();
    for (flags, message) in &cases {
        for args in [&["list-unit-files"][..], &["destroy", "seeded.service"][..]] {
            let mut all = vec!["--request-timeout", "2"];
            if !flags.contains(&"--endpoint") {
                all.extend(["--endpoint", endpoint.as_str()]);
            }
            all.extend(flags);
            all.extend(args);
            let o = env.fleetctl_raw(&all);
            if let Err(why) = refused(&o, message) {
                failures.push(format!("{flags:?} {args:?}: {why}"));
            }
        }
    }
    assert_eq!(env.dump().await, before, "a refused command changed etcd");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // With the right files, the same commands work.
    let o = env.fleetctl(&["cat", "seeded.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), HELLO);
}

/// A valid unit file of just under 1 MiB (the largest fleetctl accepts), `tag` making it
/// unique.
fn near_limit_file(tag: usize) -> String {
    let max = fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
    let mut text = format!("[Unit]\nDescription=big {tag}\n[Service]\nExecStart=/bin/true\n");
    let line = format!("Environment=X={}\n", "x".repeat(1000));
    while text.len() + line.len() < max - 64 {
        text.push_str(&line);
    }
    text
}

/// Issue 13: five accepted units of ~1 MiB each made every listing fail with tonic's 4 MiB
/// "decoded message length too large".
#[tokio::test]
async fn more_than_4_mib_of_unit_files_still_list() {
    let env = Env::new("big-registry").await;
    for i in 0..5 {
        let path = env.write(&format!("big{i}.service"), near_limit_file(i));
        let o = env.fleetctl(&["submit", &path]);
        assert!(o.status.success(), "submit {i}: {}", stderr(&o));
    }
    let before = env.dump().await;
    let files: usize = before.1.iter().map(|(_, v, _)| v.len()).sum();
    assert!(files > 4 << 20, "only {files} bytes in etcd");
    let o = env.fleetctl(&["list-unit-files", "--no-legend", "--fields=unit,dstate"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert_eq!(listed.len(), 6, "{listed:?}");
    assert!(
        listed.iter().any(|l| l.starts_with("big4.service")),
        "{listed:?}"
    );
    let o = env.fleetctl(&["list-units"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(env.dump().await, before, "a listing changed etcd");
}

/// Issue 38: units that fit one by one fit in one command. 5 files of ~1 MiB were one 4.8 MB
/// request (`grpc: received message larger than max`), 200 of 96 KB one too (`request is too
/// large`), and nothing was written; batches are now cut by bytes as well as by count.
#[tokio::test]
async fn many_large_units_are_submitted_and_replaced_in_one_command() {
    let env = Env::new("many-large").await;
    let big: Vec<String> = (0..5)
        .map(|i| env.write(&format!("big{i}.service"), near_limit_file(i)))
        .collect();
    let mut args = vec!["submit"];
    args.extend(big.iter().map(String::as_str));
    let o = env.fleetctl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let medium: Vec<String> = (0..200)
        .map(|i| {
            let mut text = format!("[Service]\nExecStart=/bin/sleep {i}\n");
            for line in 0..95 {
                text.push_str(&format!("Environment=X{line}={}\n", "x".repeat(1000)));
            }
            env.write(&format!("mid{i}.service"), text)
        })
        .collect();
    let mut args = vec!["submit"];
    args.extend(medium.iter().map(String::as_str));
    let o = env.fleetctl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // And a replace of the five large ones at once.
    for (i, path) in big.iter().enumerate() {
        std::fs::write(path, near_limit_file(100 + i)).unwrap();
    }
    let mut args = vec!["submit", "--replace"];
    args.extend(big.iter().map(String::as_str));
    let o = env.fleetctl(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // 24 MB of unit files listed in one page: in this debug build, over the API driver (a
    // server on one thread), 0.85-1.2 s warm and 2.9-4.3 s for the first listing, which
    // starts the held view and reads its page from etcd meanwhile. The suite's 2 s deadline
    // failed it now and then; what this test checks is the submit, so the listing gets 30 s.
    let o = env.fleetctl_over_within(
        &env.over,
        "30",
        &["list-unit-files", "--no-legend", "--fields=unit"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 206, "{}", stderr(&o));
    let o = env.fleetctl(&["cat", "big3.service"]);
    assert!(stdout(&o).contains("Description=big 103"), "{}", stderr(&o));
}

/// Issue 13: one non-JSON value made every listing fail for everyone, and destroy too.
/// Listings skip it with a warning naming the key (exit 0, the table still prints); destroy
/// removes it, and nothing else.
#[tokio::test]
async fn a_corrupt_registry_value_is_skipped_with_a_warning_and_destroy_removes_it() {
    let env = Env::new("corrupt-value").await;
    let clean = env.dump().await;
    let kv: EtcdKv = env.etcd.kv().await;
    let prefix = fleet_registry::DEFAULT_PREFIX;
    let evil = format!("{prefix}unit/evil1.service");
    let state = fleet_registry::Keys::new(prefix)
        .state(&"m1".parse().unwrap(), &"evil2.service".parse().unwrap());
    for key in [&evil, &state] {
        let put = fleet_registry::kv::TxnOp::Put {
            key: key.clone(),
            value: b"not json".to_vec(),
            lease: None,
        };
        let txn = fleet_registry::kv::Txn {
            success: vec![put],
            ..Default::default()
        };
        kv.txn(txn).await.unwrap();
    }
    let corrupt = env.dump().await;
    for (args, key) in [
        (vec!["list-unit-files", "--no-legend"], &evil),
        (vec!["list-units"], &state),
    ] {
        let o = env.fleetctl(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("WARNING") && err.contains(key.as_str()),
            "{args:?}: {err}"
        );
        assert!(!stdout(&o).contains("evil"), "{args:?}: {}", stdout(&o));
        assert_eq!(env.dump().await, corrupt, "{args:?} changed etcd");
    }
    let o = env.fleetctl(&["list-unit-files", "--no-legend", "--fields=unit"]);
    assert_eq!(stdout(&o), "seeded.service\n");

    let o = env.fleetctl(&["destroy", "evil1.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Destroyed evil1.service\n");
    assert!(stderr(&o).contains(&evil), "{}", stderr(&o));
    let (_, after) = env.dump().await;
    let (_, mut want) = corrupt;
    want.retain(|(k, _, _)| *k != evil);
    assert!(want.len() > clean.1.len());
    assert_eq!(
        after, want,
        "destroy removed more (or less) than the record"
    );
}

/// Issue 13's findings against fleetctl: each refused with its reason, nothing written.
#[tokio::test]
async fn issue_13_bad_inputs_are_refused_with_a_reason_and_write_nothing() {
    let env = Env::new("issue-13").await;
    let unit = |name: &str, text: &str| env.write(name, text);
    std::fs::create_dir_all(env.dir.join("d1")).unwrap();
    std::fs::create_dir_all(env.dir.join("d2")).unwrap();
    let d1 = unit("d1/col.service", "[Service]\nExecStart=/bin/sleep 1\n");
    let d2 = unit("d2/col.service", "[Service]\nExecStart=/bin/sleep 2\n");
    let nul = unit("nul0.service", "[Service]\nExecStart=/bin/true\n\0x\n");
    let xfleet = |name: &str, line: &str| {
        unit(
            name,
            &format!("[Service]\nExecStart=/bin/true\n\n[X-Fleet]\n{line}\n"),
        )
    };
    let x = [
        (
            xfleet("self.service", "MachineOf=self.service"),
            "MachineOf cannot name the unit itself",
        ),
        (
            xfleet("mid.service", "MachineID=../../etc"),
            "MachineID \"../../etc\" is not a machine ID",
        ),
        (
            xfleet("peer.service", "MachineOf=bad name.service"),
            "MachineOf \"bad name.service\" is not a unit name",
        ),
        (
            xfleet("conf.service", "Conflicts=["),
            "Conflicts \"[\" is not a valid glob",
        ),
        (
            xfleet("meta1.service", "MachineMetadata=noequals"),
            "MachineMetadata \"noequals\" is not key=value",
        ),
        (
            xfleet("meta2.service", "MachineMetadata==x"),
            "MachineMetadata \"=x\" is not key=value",
        ),
        (
            xfleet("repl.service", "Replaces=bad name"),
            "Replaces \"bad name\" can never match a unit name",
        ),
        (
            xfleet("glob.service", "Global=yesplease"),
            "Global \"yesplease\" is not true or false",
        ),
    ];
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["destroy", ""], "unit name cannot be empty"),
        (vec!["destroy", "."], "unit name cannot be \".\""),
        (vec!["cat", ""], "unit name cannot be empty"),
        (
            vec!["start", "--no-block", "dir/.."],
            "unit name cannot be \"..\"",
        ),
        (vec!["submit", &nul], "line 3: expected Name=Value"),
        (
            vec!["submit", &d1, &d2],
            "col.service is given twice with different content",
        ),
        (
            vec!["start", "--no-block", &d1, &d2],
            "given twice with different content",
        ),
        (
            vec!["start", "--replace", "--rolling=0", "seeded.service"],
            "0 is not in 1..",
        ),
        (
            vec![
                "start",
                "--replace",
                "--no-restart",
                "--reschedule",
                "seeded.service",
            ],
            "cannot be used with",
        ),
        (
            vec!["--ssh-timeout", "1e20", "status", "seeded.service"],
            "is out of range",
        ),
        (
            vec![
                "--ssh-username=-oProxyCommand=touch /tmp/pwned",
                "status",
                "seeded.service",
            ],
            "an SSH user name cannot be an option",
        ),
        (
            vec!["--tunnel=-oProxyCommand=x", "journal", "seeded.service"],
            "cannot be an option",
        ),
        (
            vec!["list-unit-files", "--fields", "unit,reasons"],
            "Invalid key in output format: \"reasons\"",
        ),
    ];
    for (path, message) in &x {
        cases.push((vec!["submit", path.as_str()], message));
    }
    env.refuses_all(&cases).await;
    // Over etcd whatever the chosen driver: the API driver does not use the key prefix (the
    // server has its own), and does not check it either.
    let prefixes: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--etcd-key-prefix", "", "list-units"],
            "key prefix \"\" must start with \"/\"",
        ),
        (
            vec!["--etcd-key-prefix", "/", "list-units"],
            "is etcd's root",
        ),
        (
            vec!["--etcd-key-prefix", "/a\nb", "destroy", "seeded.service"],
            "control character",
        ),
    ];
    env.refuses_all_over(&Over::Etcd, &prefixes).await;
    assert!(
        !Path::new("/tmp/pwned").exists(),
        "ssh ran the user name as an option"
    );
}

/// Flags, environment variables, and the message of their refusal.
type ConnectCase<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);

/// Flags read before any connection: timeouts, endpoints, TLS files; flags and environment.
/// Over etcd whatever the chosen driver: the endpoints and TLS files are etcd's.
#[tokio::test]
async fn issue_13_bad_connection_settings_are_refused_before_anything_is_sent() {
    let env = Env::new("issue-13-connect").await;
    let endpoint = env.etcd.endpoint();
    let hostname = "/etc/hostname".to_owned();
    let cases: Vec<ConnectCase> = vec![
        (
            vec!["--request-timeout", "1e19"],
            vec![],
            "is out of range: from 0.001 to 86400 seconds",
        ),
        (vec!["--request-timeout", "1e-9"], vec![], "is out of range"),
        (
            vec![],
            vec![("FLEETCTL_REQUEST_TIMEOUT", "1e19")],
            "is out of range",
        ),
        (
            vec!["--endpoint", "ftp://127.0.0.1:2379"],
            vec![],
            "scheme \"ftp\" is not supported",
        ),
        (
            vec!["--endpoint", "unix:///run/etcd.sock"],
            vec![],
            "unix sockets are not supported yet",
        ),
        (
            vec!["--endpoint", "notaurl"],
            vec![],
            "\"notaurl\": is not a URL",
        ),
        (
            vec!["--endpoint", "http://127.0.0.1:99999"],
            vec![],
            "port \"99999\" is not a port (1-65535)",
        ),
        (
            vec!["--endpoint", &endpoint, "--ca-file", &hostname],
            vec![],
            "TLS file /etc/hostname given, but the etcd endpoints are http://",
        ),
        (
            vec!["--endpoint", &endpoint, "--cert-file", "/nonexistent/c.pem"],
            vec![],
            "TLS file /nonexistent/c.pem given",
        ),
        (
            vec![
                "--endpoint",
                "https://127.0.0.1:1",
                "--ca-file",
                "/dev/zero",
            ],
            vec![],
            "cannot read /dev/zero: not a regular file",
        ),
        (
            vec![
                "--endpoint",
                "https://127.0.0.1:1",
                "--ca-file",
                "/nonexistent/ca.pem",
            ],
            vec![],
            "cannot read /nonexistent/ca.pem",
        ),
    ];
    let before = env.dump().await;
    let mut failures = Vec::new();
    for (flags, vars, message) in &cases {
        for args in [&["list-unit-files"][..], &["destroy", "seeded.service"][..]] {
            let mut all: Vec<&str> = Vec::new();
            if !flags.contains(&"--endpoint") {
                all.extend(["--endpoint", endpoint.as_str()]);
            }
            all.extend(flags);
            all.extend(args);
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
            cmd.args(&all)
                .current_dir(&env.dir)
                .env_remove("FLEETCTL_ENDPOINT")
                // These tests run fleetctl against a test etcd, on a port of its own.
                .env("FLEETCTL_DRIVER", "etcd");
            for (k, v) in vars {
                cmd.env(k, v);
            }
            let o = cmd.output().unwrap();
            if let Err(why) = refused(&o, message) {
                failures.push(format!("{flags:?} {vars:?} {args:?}: {why}"));
            }
        }
    }
    assert_eq!(env.dump().await, before, "a refused command changed etcd");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn a_unit_named_twice_is_acted_on_once() {
    let env = Env::new("twice").await;
    let tw = env.write("tw.service", HELLO);
    let o = env.fleetctl(&["submit", &tw, "tw", "tw.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Unit tw.service inactive\n");
    // The same content under two paths is one unit too.
    std::fs::create_dir_all(env.dir.join("d1")).unwrap();
    std::fs::create_dir_all(env.dir.join("d2")).unwrap();
    let d1 = env.write("d1/same.service", HELLO);
    let d2 = env.write("d2/same.service", HELLO);
    let o = env.fleetctl(&["submit", &d1, &d2]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Unit same.service inactive\n");
    env.write("t@.service", HELLO);
    let o = env.fleetctl(&["load", "--no-block", "t@1", "t@1.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Triggered unit t@1.service load\n");
    let o = env.fleetctl(&["destroy", "tw", "tw", "tw.service"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Destroyed tw.service\n");
    // Several failures are counted without the doubled "failed".
    let o = env.fleetctl(&["stop", "--no-block", "nope1", "nope2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o)
            .trim_end()
            .ends_with("Error changing state of 2 units"),
        "{}",
        stderr(&o)
    );
}

#[tokio::test]
async fn content_systemd_reads_the_same_is_stored_the_same() {
    let env = Env::new("same-content").await;
    let plain = "[Service]\nExecStart=/bin/true \\\n";
    let a = env.write("eof1.service", plain);
    let b = env.write("eof2.service", plain.trim_end_matches('\n'));
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend_from_slice(plain.as_bytes());
    let c = env.write("bom.service", bom);
    let o = env.fleetctl(&["submit", &a, &b, &c]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = env.fleetctl(&[
        "list-unit-files",
        "--no-legend",
        "--full",
        "--fields",
        "unit,hash",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hashes: std::collections::BTreeMap<String, String> = stdout(&o)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(u, h)| (u.trim().to_owned(), h.trim().to_owned()))
        .collect();
    assert_eq!(hashes["eof1.service"], hashes["eof2.service"], "{hashes:?}");
    assert_eq!(hashes["eof1.service"], hashes["bom.service"], "{hashes:?}");
}

#[tokio::test]
async fn list_unit_files_shows_the_reason_field_it_lists_in_help() {
    let env = Env::new("reason").await;
    let o = env.fleetctl(&["list-unit-files", "--fields", "unit,reason"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "UNIT\t\tREASON\nseeded.service\t-\n");
}

#[tokio::test]
async fn long_names_are_echoed_cut_short() {
    let env = Env::new("long-echo").await;
    let name = "n".repeat(10_000);
    let o = env.fleetctl(&["destroy", &name]);
    refused(&o, "unit name exceeds maximum length (256)").unwrap();
    assert!(
        stderr(&o).len() < 600,
        "{} bytes: {}",
        stderr(&o).len(),
        stderr(&o)
    );
    assert!(stderr(&o).contains('…'));
}

/// A failed write to standard output is an error; a reader that went away (`| head`) ends
/// fleetctl quietly with 141, as SIGPIPE ends `cat`.
#[tokio::test]
async fn a_failed_write_to_stdout_is_an_error_and_a_closed_pipe_is_quiet() {
    let env = Env::new("stdout").await;
    let before = env.dump().await;
    for args in [
        &["cat", "seeded.service"][..],
        &["version"][..],
        &["list-unit-files"][..],
        &["list-units"][..],
        &["list-machines"][..],
    ] {
        let all = vec![
            "--driver".to_owned(),
            env.over.driver().to_owned(),
            "--endpoint".to_owned(),
            env.over.endpoint(&env.etcd.endpoint()),
        ]
        .into_iter()
        .chain(args.iter().map(|a| (*a).to_owned()))
        .collect::<Vec<_>>();
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
            .args(&all)
            .stdout(full)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("writing to standard output: No space left on device"),
            "{args:?}: {}",
            stderr(&o)
        );
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
            .args(&all)
            .stdout(writer)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(141), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
    assert_eq!(env.dump().await, before);
}
