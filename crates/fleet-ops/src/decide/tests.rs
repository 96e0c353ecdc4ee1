use super::*;
use fleet_registry::UnitRecord;

const PLAIN: &str = "[Service]\nExecStart=/bin/true\n";
const OTHER: &str = "[Service]\nExecStart=/bin/false\n";
const GLOBAL: &str = "[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\n";

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn file(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap()
}

fn machine(c: char) -> MachineId {
    c.to_string().repeat(32).parse().unwrap()
}

fn unit(n: &str, text: &str, desired: DesiredState) -> Unit {
    Unit {
        record: UnitRecord {
            name: name(n),
            hash: file(text).hash(),
            desired,
            restart: 0,
            replace: ReplaceState::default(),
        },
        mod_revision: 3,
    }
}

fn put(n: &str, text: Option<&str>, desired: Option<DesiredState>) -> PutRequest {
    PutRequest {
        name: name(n),
        file: text.map(file),
        desired,
        how: ReplaceHow::default(),
    }
}

#[test]
fn a_new_unit_is_created_inactive_unless_asked_and_needs_options() {
    let plan = decide_put(&put("a.service", Some(PLAIN), None), None).unwrap();
    assert_eq!(
        plan,
        PutPlan::Create {
            file: file(PLAIN),
            desired: DesiredState::Inactive
        }
    );
    let plan = decide_put(
        &put("a.service", Some(PLAIN), Some(DesiredState::Launched)),
        None,
    )
    .unwrap();
    assert!(matches!(
        plan,
        PutPlan::Create {
            desired: DesiredState::Launched,
            ..
        }
    ));
    assert!(matches!(
        decide_put(&put("a.service", None, Some(DesiredState::Launched)), None),
        Err(OpsError::NoOptions(_))
    ));
}

#[test]
fn a_template_is_never_activated_by_a_create_a_replace_or_a_state() {
    for desired in [DesiredState::Loaded, DesiredState::Launched] {
        assert!(matches!(
            decide_put(&put("t@.service", Some(PLAIN), Some(desired)), None),
            Err(OpsError::ActivateTemplate(_))
        ));
        let existing = unit("t@.service", PLAIN, DesiredState::Inactive);
        let f = file(PLAIN);
        assert!(matches!(
            decide_put(
                &put("t@.service", None, Some(desired)),
                Some((&existing, &f))
            ),
            Err(OpsError::ActivateTemplate(_))
        ));
        assert!(matches!(
            decide_state(StateChange::Raise(desired), &existing),
            Err(OpsError::ActivateTemplate(_))
        ));
    }
    assert!(decide_put(&put("t@.service", Some(PLAIN), None), None).is_ok());
}

#[test]
fn the_template_rule_lets_a_template_be_only_inactive_and_an_instance_anything() {
    let template = name("t@.service");
    assert!(template_check(&template, DesiredState::Inactive).is_ok());
    for desired in [DesiredState::Loaded, DesiredState::Launched] {
        let err = template_check(&template, desired).unwrap_err();
        assert_eq!(err.to_string(), "cannot activate template t@.service");
        assert!(template_check(&name("t@1.service"), desired).is_ok());
    }
}

#[test]
fn other_content_replaces_keeping_or_raising_the_state_never_lowering_it() {
    let existing = unit("a.service", PLAIN, DesiredState::Loaded);
    let f = file(PLAIN);
    let plan = decide_put(&put("a.service", Some(OTHER), None), Some((&existing, &f))).unwrap();
    assert!(matches!(
        plan,
        PutPlan::Replace {
            desired: DesiredState::Loaded,
            ..
        }
    ));
    let plan = decide_put(
        &put("a.service", Some(OTHER), Some(DesiredState::Launched)),
        Some((&existing, &f)),
    )
    .unwrap();
    assert!(matches!(
        plan,
        PutPlan::Replace {
            desired: DesiredState::Launched,
            ..
        }
    ));
    let lowered = decide_put(
        &put("a.service", Some(OTHER), Some(DesiredState::Inactive)),
        Some((&existing, &f)),
    );
    assert_eq!(
        lowered.unwrap_err().to_string(),
        "can not replace Unit(a.service) in state 'loaded' with one in state 'inactive'"
    );
}

#[test]
fn the_same_content_sets_a_state_or_is_unchanged() {
    let existing = unit("a.service", PLAIN, DesiredState::Launched);
    let f = file(PLAIN);
    for text in [Some(PLAIN), None] {
        let plan = decide_put(
            &put("a.service", text, Some(DesiredState::Inactive)),
            Some((&existing, &f)),
        )
        .unwrap();
        assert!(matches!(
            plan,
            PutPlan::SetState {
                desired: DesiredState::Inactive,
                ..
            }
        ));
        for desired in [None, Some(DesiredState::Launched)] {
            assert_eq!(
                decide_put(&put("a.service", text, desired), Some((&existing, &f))).unwrap(),
                PutPlan::Unchanged(existing.clone())
            );
        }
    }
}

#[test]
fn impossible_requirements_are_refused_before_anything_is_written() {
    let bad = "[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nMachineID=abc\n";
    let err = decide_put(&put("a.service", Some(bad), None), None).unwrap_err();
    assert!(matches!(err, OpsError::Invalid { .. }), "{err}");
    assert!(err.to_string().starts_with("a.service: "), "{err}");
}

#[test]
fn the_unit_check_says_why_and_each_side_words_it_from_the_same_error() {
    let bad = file("[Service]\nExecStart=/bin/true\n[X-Fleet]\nGlobal=true\nMachineID=abc\n");
    let n = name("a.service");
    let reason = check_requirements(&n, &bad).unwrap_err().to_string();
    // The API answers the reason alone; fleetctl names the unit first.
    assert_eq!(
        validate_file(&n, &bad).unwrap_err().to_string(),
        format!("a.service: {reason}")
    );
    assert!(check_requirements(&n, &file(GLOBAL)).is_ok());
    assert!(validate_file(&n, &file(PLAIN)).is_ok());
}

#[test]
fn stop_lowers_a_launched_unit_and_refuses_an_inactive_one() {
    let stop = |d| decide_state(StateChange::Stop, &unit("a.service", PLAIN, d));
    assert_eq!(
        stop(DesiredState::Launched).unwrap(),
        Some(DesiredState::Loaded)
    );
    assert_eq!(stop(DesiredState::Loaded).unwrap(), None);
    assert_eq!(
        stop(DesiredState::Inactive).unwrap_err().to_string(),
        "Unable to stop unit a.service in state inactive"
    );
}

#[test]
fn unload_makes_anything_inactive_and_raise_never_lowers() {
    for d in [DesiredState::Loaded, DesiredState::Launched] {
        let u = unit("a.service", PLAIN, d);
        assert_eq!(
            decide_state(StateChange::Unload, &u).unwrap(),
            Some(DesiredState::Inactive)
        );
        assert_eq!(
            decide_state(StateChange::Raise(DesiredState::Loaded), &u).unwrap(),
            None
        );
    }
    let u = unit("a.service", PLAIN, DesiredState::Inactive);
    assert_eq!(decide_state(StateChange::Unload, &u).unwrap(), None);
    assert_eq!(
        decide_state(StateChange::Raise(DesiredState::Launched), &u).unwrap(),
        Some(DesiredState::Launched)
    );
}

#[test]
fn restart_bumps_a_launched_unit_launches_a_loaded_one_and_refuses_an_inactive_one() {
    let r = |d| decide_restart(&unit("a.service", PLAIN, d));
    assert_eq!(
        r(DesiredState::Launched).unwrap(),
        RestartPlan::NewGeneration
    );
    assert_eq!(r(DesiredState::Loaded).unwrap(), RestartPlan::Launch);
    assert_eq!(
        r(DesiredState::Inactive).unwrap_err().to_string(),
        "Unable to restart unit a.service in state inactive"
    );
}

#[test]
fn a_reschedule_avoids_where_the_unit_runs_and_only_a_global_unit_rolls() {
    let existing = unit("a.service", GLOBAL, DesiredState::Launched);
    let how = ReplaceHow {
        no_restart: true,
        reschedule: true,
        rolling: true,
        fleet_form: false,
    };
    let state = replace_state(
        how,
        &existing,
        DesiredState::Launched,
        Some(&machine('a')),
        true,
    );
    assert!(state.no_restart);
    assert_eq!(state.placement, 1);
    assert_eq!(state.avoid, Some(machine('a')));
    assert_eq!(
        state.rollout,
        Some(Rollout {
            previous: existing.hash(),
            updated: BTreeSet::new()
        })
    );
    assert_eq!(
        replace_state(how, &existing, DesiredState::Launched, None, false).rollout,
        None
    );
    let plain = replace_state(
        ReplaceHow::default(),
        &existing,
        DesiredState::Launched,
        Some(&machine('a')),
        true,
    );
    assert_eq!(plain, ReplaceState::default());
}

#[test]
fn a_replace_in_fleets_form_leaves_the_unit_inactive_and_keeps_its_machine() {
    let existing = unit("a.service", PLAIN, DesiredState::Launched);
    let old = file(PLAIN);
    let mut req = put("a.service", Some(OTHER), None);
    req.how.fleet_form = true;
    let plan = decide_put(&req, Some((&existing, &old))).unwrap();
    assert!(matches!(
        plan,
        PutPlan::Replace {
            desired: DesiredState::Inactive,
            ..
        }
    ));
    // A state asked in fleet's form is taken as asked, lower than now too.
    req.desired = Some(DesiredState::Loaded);
    let plan = decide_put(&req, Some((&existing, &old))).unwrap();
    assert!(matches!(
        plan,
        PutPlan::Replace {
            desired: DesiredState::Loaded,
            ..
        }
    ));
    let state = replace_state(
        req.how,
        &existing,
        DesiredState::Inactive,
        Some(&machine('a')),
        false,
    );
    assert_eq!(state.prefer, Some(machine('a')));
    assert_eq!(state.avoid, None);
    // A unit left placed needs no machine kept: nothing would ever clear it.
    let placed = replace_state(
        req.how,
        &existing,
        DesiredState::Loaded,
        Some(&machine('a')),
        false,
    );
    assert_eq!(placed.prefer, None);
    // Ours keeps the state and asks for no machine.
    let plain = replace_state(
        ReplaceHow::default(),
        &existing,
        DesiredState::Inactive,
        Some(&machine('a')),
        false,
    );
    assert_eq!(plain.prefer, None);
}

/// Issue 39, item 3: the create/keep/replace rule both fleetctl and the API run.
#[test]
fn content_is_new_same_or_differs_and_a_replace_never_lowers_the_desired_state() {
    let (a, b) = (file(PLAIN).hash(), file(OTHER).hash());
    assert_eq!(content(None, a), Content::New);
    assert_eq!(content(Some(a), a), Content::Same);
    assert_eq!(content(Some(a), b), Content::Differs);
    use DesiredState::{Inactive, Launched, Loaded};
    // fleet's rule for fleetctl: submit replaces only inactive units, load inactive or
    // loaded, start any.
    let may = |asked, existing| !replace_lowers(existing, asked);
    assert!(may(Inactive, Inactive) && !may(Inactive, Loaded) && !may(Inactive, Launched));
    assert!(may(Loaded, Inactive) && may(Loaded, Loaded) && !may(Loaded, Launched));
    assert!(may(Launched, Inactive) && may(Launched, Loaded) && may(Launched, Launched));
}
