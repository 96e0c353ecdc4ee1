use super::*;

const PLAIN: &str = "[Service]\nExecStart=/bin/sleep 1000\n";
const GLOBAL: &str = "[Service]\nExecStart=/bin/sleep 1000\n[X-Fleet]\nGlobal=true\n";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn file(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap()
}

fn unit(n: &str, text: &str, desired: DesiredState) -> Unit {
    UnitStatus {
        name: name(n),
        hash: file(text).hash(),
        desired,
        machines: vec![],
        unscheduled: None,
        restart: 0,
    }
}

fn machine(c: char) -> MachineId {
    c.to_string().repeat(32).parse().unwrap()
}

fn create(n: &str, text: &str) -> Prepared {
    Prepared {
        name: name(n),
        action: Action::Create(file(text)),
    }
}

fn keep(n: &str, text: &str, desired: DesiredState) -> Prepared {
    Prepared {
        name: name(n),
        action: Action::Keep(unit(n, text, desired)),
    }
}

fn replace(n: &str, old: &str, new: &str) -> Prepared {
    Prepared {
        name: name(n),
        action: Action::Replace {
            existing: unit(n, old, DesiredState::Launched),
            file: file(new),
        },
    }
}

const START: Request = Request {
    target: DesiredState::Launched,
    wait: true,
};

fn thens(steps: &[Step]) -> Vec<(String, Then)> {
    steps.iter().map(|s| (s.name.to_string(), s.then)).collect()
}

fn pairs(list: &[(&str, Then)]) -> Vec<(String, Then)> {
    list.iter().map(|(n, t)| (n.to_string(), *t)).collect()
}

#[test]
fn created_replaced_and_kept_units_at_the_target_are_all_waited_for() {
    let prepared = vec![
        create("a.service", PLAIN),
        replace("b.service", PLAIN, "[Service]\nExecStart=/bin/true\n"),
        keep("c.service", PLAIN, DesiredState::Launched),
    ];
    let steps = decide(prepared, &View::default(), START);
    assert_eq!(
        thens(&steps),
        pairs(&[
            ("a.service", Then::Wait),
            ("b.service", Then::Wait),
            ("c.service", Then::Wait),
        ])
    );
}

#[test]
fn a_kept_global_unit_at_the_target_is_not_waited_for_as_there_is_no_one_machine() {
    let prepared = vec![keep("g.service", GLOBAL, DesiredState::Launched)];
    let wanted = needs(&prepared, START);
    assert!(
        wanted.files.contains_key(&file(GLOBAL).hash()),
        "{wanted:?}"
    );
    let view = View {
        placed: BTreeMap::new(),
        files: BTreeMap::from([(file(GLOBAL).hash(), file(GLOBAL))]),
    };
    let steps = decide(prepared, &view, START);
    assert_eq!(thens(&steps), pairs(&[("g.service", Then::Nothing)]));
}

#[test]
fn load_never_lowers_a_launched_unit_and_says_nothing_of_it() {
    let load = Request {
        target: DesiredState::Loaded,
        ..START
    };
    let prepared = vec![keep("up.service", PLAIN, DesiredState::Launched)];
    assert_eq!(needs(&prepared, load), Needs::default());
    let steps = decide(prepared, &View::default(), load);
    assert_eq!(thens(&steps), pairs(&[("up.service", Then::Nothing)]));
}

#[test]
fn a_kept_unit_below_the_target_is_raised_and_its_file_read_once_per_hash() {
    let prepared = vec![
        keep("hello@1.service", PLAIN, DesiredState::Loaded),
        keep("hello@2.service", PLAIN, DesiredState::Inactive),
        keep("g.service", GLOBAL, DesiredState::Loaded),
    ];
    let wanted = needs(&prepared, START);
    assert_eq!(wanted.files.len(), 2, "{wanted:?}");
    assert!(wanted.files.contains_key(&file(PLAIN).hash()));
    assert!(wanted.placements.is_empty());
    let view = View {
        placed: BTreeMap::new(),
        files: [file(PLAIN), file(GLOBAL)]
            .into_iter()
            .map(|f| (f.hash(), f))
            .collect(),
    };
    let steps = decide(prepared, &view, START);
    assert_eq!(
        thens(&steps),
        pairs(&[
            ("hello@1.service", Then::Wait),
            ("hello@2.service", Then::Wait),
            ("g.service", Then::Global),
        ])
    );
}

#[test]
fn a_global_unit_is_said_at_once_instead_of_waited_for() {
    let steps = decide(vec![create("g.service", GLOBAL)], &View::default(), START);
    assert_eq!(thens(&steps), pairs(&[("g.service", Then::Global)]));
}

#[test]
fn without_waiting_every_changed_unit_is_triggered_and_no_file_is_read() {
    let no_block = Request {
        wait: false,
        ..START
    };
    let prepared = vec![
        create("g.service", GLOBAL),
        keep("k.service", PLAIN, DesiredState::Loaded),
        keep("up.service", PLAIN, DesiredState::Launched),
    ];
    assert!(needs(&prepared, no_block).files.is_empty());
    let steps = decide(prepared, &View::default(), no_block);
    assert_eq!(
        thens(&steps),
        pairs(&[
            ("g.service", Then::Triggered),
            ("k.service", Then::Triggered),
            ("up.service", Then::Nothing),
        ])
    );
}

#[test]
fn only_replaced_units_need_their_placement_in_argument_order() {
    let prepared = vec![
        replace("z.service", PLAIN, GLOBAL),
        create("a.service", PLAIN),
        replace("b.service", GLOBAL, PLAIN),
    ];
    let wanted = needs(&prepared, START);
    assert_eq!(
        wanted.placements,
        vec![name("z.service"), name("b.service")]
    );
}

#[test]
fn steps_keep_the_argument_order_and_their_actions() {
    let steps = decide(
        vec![create("b.service", PLAIN), create("a.service", PLAIN)],
        &View::default(),
        START,
    );
    let names: Vec<String> = steps.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["b.service", "a.service"]);
    assert!(matches!(steps[0].action, Action::Create(_)));
}

#[test]
fn a_replaced_unit_is_reported_in_place_or_moved_and_not_at_all_without_both_machines() {
    let names = [
        name("same.service"),
        name("moved.service"),
        name("gone.service"),
        name("new.service"),
    ];
    let before: BTreeMap<_, _> = [
        (name("same.service"), machine('a')),
        (name("moved.service"), machine('a')),
        (name("gone.service"), machine('b')),
    ]
    .into_iter()
    .collect();
    let now: BTreeMap<_, _> = [
        (name("same.service"), machine('a')),
        (name("moved.service"), machine('c')),
        (name("new.service"), machine('c')),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        placements(&names, &before, &now),
        [
            Placement::InPlace {
                name: name("same.service"),
                machine: machine('a'),
            },
            Placement::Moved {
                name: name("moved.service"),
                from: machine('a'),
                to: machine('c'),
            },
        ]
    );
}

#[test]
fn placed_is_the_first_scheduled_machine_of_the_named_units() {
    let mut a = unit("a.service", PLAIN, DesiredState::Launched);
    a.machines = vec![machine('b'), machine('c')];
    let mut b = unit("b.service", PLAIN, DesiredState::Launched);
    b.machines = vec![machine('a')];
    let nowhere = unit("n.service", PLAIN, DesiredState::Launched);
    let got = placed([&a, &b, &nowhere], &[name("a.service"), name("n.service")]);
    assert_eq!(got, BTreeMap::from([(name("a.service"), machine('b'))]));
}
