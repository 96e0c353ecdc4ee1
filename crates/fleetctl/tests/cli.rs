//! fleetctl end to end against a real etcd started by the test: messages, exit codes and,
//! for every bad input, proof that nothing was written. Over the etcd driver, or the API
//! driver with `FLEETCTL_TEST_DRIVER=api` (`over/mod.rs`).

mod over;

use fleet_registry::kv::Kv;
use fleet_testing::TestEtcd;
use over::Over;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const HELLO: &str =
    "[Service]\nExecStart=/bin/bash -c \"while true; do echo Hello, World!; sleep 1; done\"\n";
const HELLO_HASH: &str = "3750b3e9f3962a56c7582929426e9abb012754cf";

/// One etcd and one scratch directory per test, and the driver fleetctl runs over.
struct Env {
    etcd: TestEtcd,
    dir: PathBuf,
    over: Over,
}

impl Env {
    async fn new(test: &str) -> Env {
        let etcd = TestEtcd::start().await;
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("fleetctl-cli")
            .join(test);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let over = Over::chosen(&etcd);
        Env { etcd, dir, over }
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    fn fleetctl(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// fleetctl with `args`, over the chosen driver to this test's etcd (on a port of its own).
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
        self.over.apply(&mut cmd, &self.etcd.endpoint());
        cmd.args(args).current_dir(&self.dir);
        cmd
    }

    /// Every key and value in etcd, to prove a failed command wrote nothing.
    async fn dump(&self) -> Vec<(String, Vec<u8>)> {
        let kv = self.etcd.kv().await;
        kv.range("/", true, None)
            .await
            .unwrap()
            .kvs
            .into_iter()
            // The events of what the commands did (issue 41) stay, on their lease.
            .filter(|kv| !kv.key.contains("/event/"))
            .map(|kv| (kv.key, kv.value))
            .collect()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn ok(o: &Output) {
    assert!(o.status.success(), "failed: {}\n{}", stdout(o), stderr(o));
}

#[track_caller]
fn fails_with(o: &Output, message: &str) {
    assert!(!o.status.success(), "should fail: {}", stdout(o));
    assert!(
        stderr(o).contains(message),
        "stderr {:?} lacks {message:?}",
        stderr(o)
    );
}

#[tokio::test]
async fn submit_then_list_cat_and_destroy_like_fleet() {
    let env = Env::new("lifecycle").await;
    let path = env.write("hello.service", HELLO);
    let o = env.fleetctl(&["submit", &path]);
    ok(&o);
    assert_eq!(stdout(&o), "Unit hello.service inactive\n");

    let o = env.fleetctl(&["list-unit-files"]);
    ok(&o);
    assert_eq!(
        stdout(&o),
        "UNIT\t\tHASH\tDSTATE\t\tSTATE\t\tTARGET\nhello.service\t3750b3e\tinactive\tinactive\t-\n"
    );
    let o = env.fleetctl(&[
        "list-unit-files",
        "--full",
        "--no-legend",
        "--fields",
        "unit,hash",
    ]);
    assert_eq!(stdout(&o), format!("hello.service\t{HELLO_HASH}\n"));
    let o = env.fleetctl(&["list-unit-files", "-l", "--no-legend", "--fields", "hash"]);
    assert_eq!(stdout(&o), format!("{HELLO_HASH}\n"));

    let o = env.fleetctl(&["cat", "hello.service"]);
    ok(&o);
    assert_eq!(stdout(&o), HELLO);

    // Submitting the same thing again is a silent no-op.
    let o = env.fleetctl(&["submit", &path]);
    ok(&o);
    assert_eq!(stdout(&o), "");

    let o = env.fleetctl(&["destroy", "hello"]);
    ok(&o);
    assert_eq!(stdout(&o), "Destroyed hello.service\n");
    assert!(
        env.dump().await.is_empty(),
        "destroy must leave nothing, file included"
    );
}

#[tokio::test]
async fn differing_local_file_warns_and_replace_swaps_content() {
    let env = Env::new("replace").await;
    env.write("hello.service", HELLO);
    let path = "hello.service";
    ok(&env.fleetctl(&["submit", path]));
    let changed = "[Service]\nExecStart=/bin/sleep 1000\n";
    env.write("hello.service", changed);

    // fleet's warning, then a non-zero exit: the command did not do what it was asked
    // (issue 38; fleet exited 0).
    let before = env.dump().await;
    let o = env.fleetctl(&["submit", path]);
    assert_eq!(
        stderr(&o),
        "WARNING: Unit hello.service in registry differs from local unit file hello.service. Add --replace to override.\n\
         Unit hello.service was left as the registry has it, not as its local file says: `submit --replace` replaces it\n"
    );
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "");
    assert_eq!(env.dump().await, before);

    let o = env.fleetctl(&["submit", "--replace", path]);
    ok(&o);
    assert_eq!(stdout(&o), "Unit hello.service inactive\n");
    assert_eq!(stdout(&env.fleetctl(&["cat", "hello"])), changed);
    // The old file is garbage-collected: one file left.
    let files = env
        .dump()
        .await
        .into_iter()
        .filter(|(k, _)| k.contains("/file/"))
        .count();
    assert_eq!(files, 1);

    let o = env.fleetctl(&["submit", "--replace", path]);
    ok(&o);
    assert_eq!(
        stdout(&o),
        "Found same Unit(hello.service) in Registry, nothing to do\n"
    );
}

#[tokio::test]
async fn instances_take_their_content_from_the_template() {
    let env = Env::new("template").await;
    env.write("web@.service", "[Service]\nExecStart=/bin/sleep %i\n");
    let arg = env.dir.join("web@10.service");
    let o = env.fleetctl(&["submit", arg.to_str().unwrap()]);
    ok(&o);
    assert_eq!(stdout(&o), "Unit web@10.service inactive\n");
    let o = env.fleetctl(&["list-unit-files", "--no-legend", "--fields", "unit"]);
    assert_eq!(
        stdout(&o),
        "web@10.service\n",
        "the template itself is not submitted"
    );
    let o = env.fleetctl(&["submit", "elsewhere/web@11.service"]);
    fails_with(
        &o,
        "unable to find template Unit(web@.service) in Registry or on filesystem",
    );
}

#[tokio::test]
async fn replace_of_an_instance_takes_the_edited_local_template_over_the_registry_one() {
    let env = Env::new("template-replace").await;
    let v1 = "[Service]\nExecStart=/bin/sleep 1%i\n";
    let v2 = "[Service]\nExecStart=/bin/sleep 2%i\n";
    env.write("hello@.service", v1);
    ok(&env.fleetctl(&["submit", "hello@.service", "hello@2.service"]));
    env.write("hello@.service", v2);

    // fleet#1691: the registry's template used to win, so this said "nothing to do".
    let o = env.fleetctl(&["submit", "--replace", "./hello@2.service"]);
    ok(&o);
    assert_eq!(stdout(&o), "Unit hello@2.service inactive\n");
    assert_eq!(stdout(&env.fleetctl(&["cat", "hello@2"])), v2);
    assert_eq!(
        stdout(&env.fleetctl(&["cat", "hello@.service"])),
        v1,
        "the registry's template is left as it was"
    );
    let o = env.fleetctl(&["submit", "--replace", "./hello@2.service"]);
    assert_eq!(
        stdout(&o),
        "Found same Unit(hello@2.service) in Registry, nothing to do\n"
    );

    // Without a local template, the registry's is the one left to take.
    std::fs::remove_file(env.dir.join("hello@.service")).unwrap();
    let o = env.fleetctl(&["submit", "--replace", "./hello@2.service"]);
    ok(&o);
    assert_eq!(stdout(&env.fleetctl(&["cat", "hello@2"])), v1);

    // A new instance with --replace takes the local template too.
    env.write("hello@.service", v2);
    ok(&env.fleetctl(&["submit", "--replace", "./hello@3.service"]));
    assert_eq!(stdout(&env.fleetctl(&["cat", "hello@3"])), v2);
}

#[tokio::test]
async fn a_local_template_differing_from_the_registry_one_is_warned_about() {
    let env = Env::new("template-warn").await;
    let v1 = "[Service]\nExecStart=/bin/sleep 1%i\n";
    let v2 = "[Service]\nExecStart=/bin/sleep 2%i\n";
    env.write("hello@.service", v1);
    ok(&env.fleetctl(&["submit", "hello@.service", "hello@1.service"]));
    env.write("hello@.service", v2);

    // fleet#1560: a new instance still takes the registry's template, but says so.
    let o = env.fleetctl(&["submit", "./hello@2.service"]);
    ok(&o);
    assert_eq!(stdout(&o), "Unit hello@2.service inactive\n");
    assert_eq!(
        stderr(&o),
        "WARNING: Unit hello@.service in registry differs from local template unit file ./hello@.service. Add --replace to override.\n"
    );
    assert_eq!(stdout(&env.fleetctl(&["cat", "hello@2"])), v1);

    // An instance already registered: fleet's own warning, nothing written, and an exit
    // that says so.
    let before = env.dump().await;
    let o = env.fleetctl(&["submit", "./hello@1.service"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "WARNING: Unit hello@1.service in registry differs from local template unit file ./hello@1.service. Add --replace to override.\n\
         Unit hello@1.service was left as the registry has it, not as its local file says: `submit --replace` replaces it\n"
    );
    assert_eq!(env.dump().await, before);

    // The same template locally: no warning.
    env.write("hello@.service", v1);
    let o = env.fleetctl(&["submit", "./hello@3.service"]);
    ok(&o);
    assert_eq!(stderr(&o), "");
}

/// fleetctl, killed if it has not finished within `limit` (a read that blocks would hang it).
fn fleetctl_within(env: &Env, args: &[&str], limit: Duration) -> Output {
    let mut child = env
        .command(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("fleetctl {args:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn a_local_template_that_cannot_be_read_leaves_the_registry_template_in_use() {
    let env = Env::new("template-unreadable").await;
    let v1 = "[Service]\nExecStart=/bin/sleep 1%i\n";
    env.write("hello@.service", v1);
    ok(&env.fleetctl(&["submit", "hello@.service", "hello@1.service"]));
    let max = fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
    let template = env.dir.join("hello@.service");

    // Each kind of local template that `submit hello@.service` would refuse. The registry's
    // template is what an instance takes, so none of them may fail (or block) the command.
    let kinds: [(&str, &dyn Fn()); 4] = [
        ("unparsable", &|| {
            std::fs::write(&template, "[Service\n").unwrap()
        }),
        ("too large", &|| {
            std::fs::write(&template, format!("[Service]\n#{}\n", "x".repeat(max))).unwrap()
        }),
        ("a directory", &|| std::fs::create_dir(&template).unwrap()),
        ("a fifo", &|| {
            let made = Command::new("mkfifo").arg(&template).status().unwrap();
            assert!(made.success());
        }),
    ];
    for (n, (kind, make)) in kinds.iter().enumerate() {
        let _ = std::fs::remove_file(&template);
        let _ = std::fs::remove_dir(&template);
        make();
        let instance = format!("./hello@{}.service", n + 2);
        let o = fleetctl_within(&env, &["submit", &instance], Duration::from_secs(30));
        assert!(o.status.success(), "{kind}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            "",
            "{kind}: nothing to compare, nothing to warn"
        );
        let name = format!("hello@{}", n + 2);
        assert_eq!(stdout(&env.fleetctl(&["cat", &name])), v1, "{kind}");

        // An instance already registered is kept as it is, without a word.
        let before = env.dump().await;
        let o = fleetctl_within(
            &env,
            &["submit", "./hello@1.service"],
            Duration::from_secs(30),
        );
        assert!(o.status.success(), "{kind}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{kind}");
        assert_eq!(env.dump().await, before, "{kind}");
    }
}

#[tokio::test]
async fn many_arguments_resolve_as_they_did_one_at_a_time() {
    let env = Env::new("many").await;
    env.write("a.service", HELLO);
    env.write("b.service", "[Service]\nExecStart=/bin/sleep 2\n");
    env.write("tpl@.service", "[Service]\nExecStart=/bin/sleep %i\n");
    ok(&env.fleetctl(&["submit", "a.service", "tpl@.service"]));
    // From now on the instances can take their content only from the registry's template.
    std::fs::remove_file(env.dir.join("tpl@.service")).unwrap();
    env.write("a.service", "[Service]\nExecStart=/bin/sleep 1\n");

    let o = env.fleetctl(&[
        "submit",
        "a.service",
        "b.service",
        "tpl@1.service",
        "tpl@2.service",
        "a.service",
    ]);
    // The others are written; a.service is not, which fails the command (issue 38).
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o),
        "Unit b.service inactive\nUnit tpl@1.service inactive\nUnit tpl@2.service inactive\n"
    );
    let warning = "WARNING: Unit a.service in registry differs from local unit file a.service. Add --replace to override.\n\
                   Unit a.service was left as the registry has it, not as its local file says: `submit --replace` replaces it\n";
    // a.service, named twice, is resolved once (issue 13).
    assert_eq!(stderr(&o), warning);
    assert_eq!(
        stdout(&env.fleetctl(&["cat", "tpl@2"])),
        "[Service]\nExecStart=/bin/sleep %i\n"
    );

    let o = env.fleetctl(&[
        "submit",
        "--replace",
        "a.service",
        "b.service",
        "tpl@1.service",
    ]);
    ok(&o);
    assert_eq!(
        stdout(&o),
        "Found same Unit(b.service) in Registry, nothing to do\n\
         Found same Unit(tpl@1.service) in Registry, nothing to do\n\
         Unit a.service inactive\n"
    );

    let before = env.dump().await;
    env.write("d.service", HELLO);
    let o = env.fleetctl(&["submit", "d.service", "a.service", "nonexistent.service"]);
    fails_with(
        &o,
        "unable to find Unit(nonexistent.service) in Registry or on filesystem",
    );
    assert_eq!(env.dump().await, before, "nothing written");
}

#[tokio::test]
async fn list_unit_files_is_sorted() {
    let env = Env::new("sorted").await;
    env.write("u@.service", "[Service]\nExecStart=/bin/true\n");
    for i in [3, 20, 1, 10, 2] {
        let arg = env.dir.join(format!("u@{i:02}.service"));
        ok(&env.fleetctl(&["submit", arg.to_str().unwrap()]));
    }
    let o = env.fleetctl(&["list-unit-files", "--no-legend", "--fields", "unit"]);
    assert_eq!(
        stdout(&o),
        "u@01.service\nu@02.service\nu@03.service\nu@10.service\nu@20.service\n"
    );
}

#[tokio::test]
async fn bad_inputs_are_refused_and_write_nothing() {
    let env = Env::new("bad").await;
    let good = env.write("good.service", HELLO);
    let malformed = env.write("malformed.service", "[Service]\nExecStart /bin/true\n");
    let big = env.write(
        "big.service",
        &format!(
            "[Service]\n{}",
            "Environment=A=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n".repeat(40_000)
        ),
    );
    let long_line = env.write(
        "long.service",
        &format!("[Service]\nExecStart=/bin/echo {}\n", "x".repeat(3000)),
    );
    let impossible = env.write(
        "impossible.service",
        "[Service]\nExecStart=/bin/true\n[X-Fleet]\nMachineID=abc\nGlobal=true\n",
    );
    let crlf = env.dir.join("crlf.service");
    std::fs::write(&crlf, b"[Service]\r\nExecStart=/bin/echo \\\r\n caf\r\n").unwrap();
    let ten_kb = "a".repeat(10_000) + ".service";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["submit", &malformed], "line 2"),
        (vec!["submit", &big], "too large"),
        (vec!["submit", &long_line], "line 2 too long"),
        (
            vec!["submit", &impossible],
            "MachineID cannot be used with Global",
        ),
        (
            vec!["submit", crlf.to_str().unwrap()],
            "line 3: expected Name=Value",
        ),
        (
            vec!["submit", "bad name"],
            "invalid character ' ' in unit name",
        ),
        (vec!["submit", "a\u{1}b.service"], "invalid character"),
        (vec!["submit", &ten_kb], "exceeds maximum length (256)"),
        (vec!["submit", "@x.service"], "cannot start in \"@\""),
        (
            vec!["submit", "nonexistent.service"],
            "unable to find Unit(nonexistent.service) in Registry or on filesystem",
        ),
        // One bad argument after a good one: the good one is not written either.
        (vec!["submit", &good, &malformed], "line 2"),
        (
            vec!["list-unit-files", "--fields", "unit,foo"],
            "Invalid key in output format: \"foo\" (valid fields: desc, dstate, global, hash, reason, state, target, unit)",
        ),
        (
            vec!["list-unit-files", "--fields", ""],
            "Must define output format",
        ),
        (
            vec!["list-units", "--fields", "bogus"],
            "Invalid key in output format",
        ),
        (vec!["cat"], "One unit file must be provided"),
        (
            vec!["cat", "missing.service"],
            "Unit missing.service not found",
        ),
        (
            vec!["destroy", "missing.service"],
            "Units not found in registry",
        ),
        (vec!["submit"], "No units given"),
        (vec!["list-units", "--bogus-flag"], "--bogus-flag"),
        (vec!["--request-timeout=-1", "list-units"], "positive"),
        (
            vec!["--request-timeout", "soon", "list-units"],
            "not a number",
        ),
    ];
    for (args, message) in cases {
        let o = env.fleetctl(&args);
        fails_with(&o, message);
        assert!(env.dump().await.is_empty(), "{args:?} wrote something");
    }
}

#[tokio::test]
async fn etcd_down_is_one_clear_line_within_the_timeout() {
    let mut env = Env::new("down").await;
    let endpoint = env.etcd.endpoint();
    env.etcd.stop();
    for args in [
        vec!["list-unit-files"],
        vec!["list-units"],
        vec!["list-machines"],
        vec!["cat", "hello.service"],
        vec!["destroy", "hello.service"],
    ] {
        let started = Instant::now();
        let o = env.fleetctl(&[&["--request-timeout", "1"][..], &args].concat());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            started.elapsed()
        );
        fails_with(&o, &endpoint);
        assert_eq!(stderr(&o).trim().lines().count(), 1, "{}", stderr(&o));
    }
}

#[tokio::test]
async fn version_and_env_endpoint_work() {
    let env = Env::new("version").await;
    let o = env.fleetctl(&["version"]);
    ok(&o);
    assert_eq!(
        stdout(&o),
        format!(
            "fleetctl version {}\nfleetd: no machine registered\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetctl"));
    cmd.arg("list-machines");
    env.over.env(&mut cmd, &env.etcd.endpoint());
    let o = cmd.output().unwrap();
    ok(&o);
    assert_eq!(stdout(&o), "MACHINE\tIP\tMETADATA\n");
}

#[tokio::test]
async fn list_machines_tells_on_stderr_when_the_engine_holds_rescheduling() {
    let env = Env::new("held").await;
    let o = env.fleetctl(&["list-machines"]);
    ok(&o);
    assert_eq!(stderr(&o), "");
    let notice = "rescheduling held: 2 of 3 machines vanished within 3s";
    let kv = env.etcd.kv().await;
    let put = fleet_registry::kv::TxnOp::Put {
        key: "/_coreos.com/fleet/engine/disruption".into(),
        value: notice.as_bytes().to_vec(),
        lease: None,
    };
    let txn = fleet_registry::kv::Txn {
        compares: vec![],
        success: vec![put],
        failure: vec![],
    };
    assert!(kv.txn(txn).await.unwrap().succeeded);
    let o = env.fleetctl(&["list-machines"]);
    ok(&o);
    // The table stays fleet's byte for byte; the notice goes to stderr.
    assert_eq!(stdout(&o), "MACHINE\tIP\tMETADATA\n");
    assert_eq!(stderr(&o), format!("Warning: {notice}\n"));
}
