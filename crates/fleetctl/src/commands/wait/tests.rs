use super::*;
use fleet_core::{MachineId, MachineInfo, UnitHash};
use fleet_ops::UnitStatus;

fn name() -> UnitName {
    "w.service".parse().unwrap()
}

fn hash(b: &[u8]) -> UnitHash {
    UnitHash::of_bytes(b)
}

fn machine(c: char) -> MachineId {
    c.to_string().repeat(32).parse().unwrap()
}

/// `w.service` (file hash of `b"new"`) scheduled to `machines`, one reachable at 10.0.0.1.
fn view(machines: &[char]) -> WaitView {
    let status = UnitStatus {
        name: name(),
        hash: hash(b"new"),
        desired: DesiredState::Launched,
        machines: machines.iter().map(|c| machine(*c)).collect(),
        unscheduled: None,
        restart: 1,
    };
    let info = MachineInfo {
        id: machine('a'),
        public_ip: "10.0.0.1".into(),
        metadata: BTreeMap::new(),
        version: String::new(),
        disable_engine: false,
        api: String::new(),
        fence_at: None,
    };
    WaitView {
        units: BTreeMap::from([(name(), status)]),
        states: BTreeMap::new(),
        machines: BTreeMap::from([(machine('a'), info)]),
    }
}

fn publish(view: &mut WaitView, m: char, file: &[u8], active: &str, restart: u64) {
    let state = StateView {
        name: name(),
        machine: machine(m),
        hash: Some(hash(file)),
        load: "loaded".into(),
        active: active.into(),
        sub: "running".into(),
        restart,
        restart_pending: false,
        restarts: 0,
        since: None,
        exit: None,
    };
    view.states
        .entry(name())
        .or_default()
        .insert(machine(m), state);
}

fn said(verdict: Verdict) -> Result<String, String> {
    match verdict {
        Verdict::Pending => Err("pending".into()),
        Verdict::Reached(line) => Ok(line),
        Verdict::Failed(line) => Err(line),
    }
}

#[test]
fn a_start_waits_for_the_new_file_active_on_its_first_machine() {
    let mut v = view(&['a']);
    assert_eq!(
        said(judge(&v, &name(), Goal::Launched, false)).unwrap_err(),
        "pending"
    );
    publish(&mut v, 'a', b"old", "active", 0);
    assert_eq!(
        said(judge(&v, &name(), Goal::Launched, false)).unwrap_err(),
        "pending"
    );
    publish(&mut v, 'a', b"new", "active", 0);
    assert_eq!(
        said(judge(&v, &name(), Goal::Launched, false)),
        Ok(format!(
            "Unit w.service launched on {}.../10.0.0.1",
            machine('a').short()
        ))
    );
}

#[test]
fn a_failed_start_and_a_destroyed_unit_end_the_wait_with_a_reason() {
    let mut v = view(&['b']);
    publish(&mut v, 'b', b"new", "failed", 0);
    let line = said(judge(&v, &name(), Goal::Launched, false)).unwrap_err();
    assert_eq!(
        line,
        format!(
            "Unit w.service failed to start on {}...: loaded/failed/running",
            machine('b').short()
        )
    );
    v.units.clear();
    let line = said(judge(&v, &name(), Goal::Loaded, false)).unwrap_err();
    assert_eq!(line, "Unit w.service was destroyed");
    assert_eq!(
        said(judge(&v, &name(), Goal::Inactive, false)),
        Ok("Unit w.service inactive".into())
    );
}

#[test]
fn an_unload_waits_until_no_machine_is_scheduled_or_reports_the_unit() {
    let mut v = view(&[]);
    publish(&mut v, 'a', b"new", "inactive", 0);
    assert_eq!(
        said(judge(&v, &name(), Goal::Inactive, false)).unwrap_err(),
        "pending"
    );
    v.states.clear();
    assert_eq!(
        said(judge(&v, &name(), Goal::Inactive, false)),
        Ok("Unit w.service inactive".into())
    );
}

#[test]
fn an_interruption_says_what_stays_and_how_to_undo_it() {
    let goals = BTreeMap::from([
        (name(), Goal::Launched),
        ("old.service".parse().unwrap(), Goal::Loaded),
    ]);
    assert_eq!(
        interrupted_text(&goals),
        [
            "Interrupted: stopped waiting; what was asked stays asked.",
            "Unit w.service stays in the cluster with desired state launched: the cluster \
             goes on working towards it.",
            "To undo: `fleetctl stop w.service` (keeps it loaded) or \
             `fleetctl destroy w.service` (removes it).",
            "Unit old.service stays in the cluster with desired state loaded: the cluster \
             goes on working towards it.",
            "To change it: `fleetctl start old.service`, `fleetctl unload old.service`, \
             or `fleetctl destroy old.service` (removes it).",
        ]
    );
}

#[test]
fn an_interruption_of_a_wait_on_many_units_names_a_few() {
    let goals: BTreeMap<UnitName, Goal> = (0..7)
        .map(|i| (format!("u{i}.service").parse().unwrap(), Goal::Restarted(2)))
        .collect();
    let text = interrupted_text(&goals);
    assert_eq!(
        text[1],
        "Units u0.service, u1.service, u2.service, u3.service, u4.service, and 2 more stay \
         in the cluster with desired state launched: the cluster goes on working towards it."
    );
    assert!(
        text[2].contains("`fleetctl destroy UNIT...`"),
        "{}",
        text[2]
    );
}

#[test]
fn a_pending_unit_stands_where_the_view_says() {
    let mut v = view(&[]);
    assert_eq!(stage(&v, &name(), Goal::Launched), Stage::NotScheduled);
    v.units.get_mut(&name()).unwrap().unscheduled = Some("no".into());
    assert_eq!(stage(&v, &name(), Goal::Launched), Stage::CannotSchedule);
    let mut v = view(&['a']);
    assert_eq!(stage(&v, &name(), Goal::Launched), Stage::WaitingForMachine);
    publish(&mut v, 'a', b"old", "active", 0);
    assert_eq!(stage(&v, &name(), Goal::Launched), Stage::WaitingForMachine);
    publish(&mut v, 'a', b"new", "activating", 0);
    assert_eq!(stage(&v, &name(), Goal::Launched), Stage::Underway);
}

/// A writer whose bytes the test reads afterwards.
#[derive(Clone, Default)]
struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

type Mem = fleet_ops::etcd::RegistryCluster<fleet_registry::kv::MemKv>;

/// A cluster on the in-memory registry with `w.service` desired launched, placed nowhere,
/// the engine's `reason` published for it; and a context printing into buffers.
async fn waiting_unit(reason: &str) -> (Ctx<Mem>, Buf, Buf) {
    use fleet_registry::kv::{Kv, Txn, TxnOp};
    let registry = fleet_registry::Registry::new(fleet_registry::kv::MemKv::new(), "/t/");
    let cluster = fleet_ops::etcd::RegistryCluster::new(registry.clone());
    let req = fleet_ops::PutRequest {
        name: name(),
        file: Some(fleet_core::UnitFile::parse(b"[Service]\nExecStart=/bin/true\n").unwrap()),
        desired: Some(DesiredState::Launched),
        how: fleet_ops::ReplaceHow::default(),
    };
    cluster.put(req).await.unwrap();
    let put = TxnOp::Put {
        key: registry.keys().unscheduled(&name()),
        value: reason.as_bytes().to_vec(),
        lease: None,
    };
    let txn = Txn {
        success: vec![put],
        ..Txn::default()
    };
    registry.raw_kv().txn(txn).await.unwrap();
    let (out, err) = (Buf::default(), Buf::default());
    let ctx = Ctx {
        cluster,
        out: Box::new(out.clone()),
        err: Box::new(err.clone()),
        write_failed: None,
    };
    (ctx, out, err)
}

#[tokio::test(start_paused = true)]
async fn ctrl_c_ends_the_wait_saying_the_unit_stays_launched() {
    let (mut ctx, out, err) =
        waiting_unit("no machine able to run unit: 3 machines lack a=b").await;
    let cluster = ctx.cluster.clone();
    let goals = BTreeMap::from([(name(), Goal::Launched)]);
    let interrupt = tokio::time::sleep(Duration::from_secs(600));
    let res = wait_until(
        &mut ctx,
        &cluster,
        goals,
        Block::Forever,
        interrupt,
        Progress::hidden(),
    )
    .await;
    let e = res.unwrap_err();
    assert!(e.downcast_ref::<Interrupted>().is_some(), "{e:#}");
    assert_eq!(out.text(), "");
    let err = err.text();
    assert!(
        err.starts_with(
            "Unit w.service cannot be scheduled yet: no machine able to run unit: \
             3 machines lack a=b\nInterrupted: "
        ),
        "{err}"
    );
    assert!(
        err.contains("Unit w.service stays in the cluster with desired state launched"),
        "{err}"
    );
    assert!(err.contains("`fleetctl destroy w.service`"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn the_progress_line_counts_the_units_and_keeps_its_clock_while_nothing_changes() {
    let (mut ctx, out, _err) = waiting_unit("zero machines available").await;
    let cluster = ctx.cluster.clone();
    let goals = BTreeMap::from([
        (name(), Goal::Launched),
        ("gone.service".parse().unwrap(), Goal::Inactive),
    ]);
    let progress = Progress::offscreen(2);
    let bar = progress.handle();
    let interrupt = tokio::time::sleep(Duration::from_millis(3500));
    let res = wait_until(
        &mut ctx,
        &cluster,
        goals,
        Block::Forever,
        interrupt,
        progress,
    )
    .await;
    assert!(res.unwrap_err().downcast_ref::<Interrupted>().is_some());
    assert_eq!(out.text(), "Unit gone.service inactive\n");
    // Cleared when the wait ended (the bar then counts as finished: 2 of 2).
    assert_eq!(
        bar.shown().map(|(_, text)| text),
        Some("1/2 units done, 3s; slowest: w.service (cannot be scheduled)".into())
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_out_of_attempts_fails_naming_the_unit_after_saying_why() {
    let (mut ctx, _out, err) = waiting_unit("zero machines available").await;
    let cluster = ctx.cluster.clone();
    let goals = BTreeMap::from([(name(), Goal::Launched)]);
    let started = Instant::now();
    let never = std::future::pending();
    let res = wait_until(
        &mut ctx,
        &cluster,
        goals,
        Block::Attempts(3),
        never,
        Progress::hidden(),
    )
    .await;
    assert_eq!(started.elapsed(), ATTEMPT * 3);
    assert_eq!(
        format!("{:#}", res.unwrap_err()),
        "Timed out waiting for units: w.service"
    );
    assert_eq!(
        err.text(),
        "Unit w.service cannot be scheduled yet: zero machines available\n"
    );
}

#[test]
fn a_restart_waits_for_the_generation_on_every_scheduled_machine() {
    let mut v = view(&['a', 'b']);
    publish(&mut v, 'a', b"new", "active", 1);
    publish(&mut v, 'b', b"new", "active", 0);
    assert_eq!(
        said(judge(&v, &name(), Goal::Restarted(1), false)).unwrap_err(),
        "pending"
    );
    publish(&mut v, 'b', b"new", "active", 1);
    assert_eq!(
        said(judge(&v, &name(), Goal::Restarted(1), true)),
        Ok(format!(
            "Unit w.service restarted on {}/10.0.0.1, {}",
            machine('a'),
            machine('b')
        ))
    );
}
