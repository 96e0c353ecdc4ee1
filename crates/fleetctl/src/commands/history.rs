//! `list-units`' columns of a unit's history on its machine (issue 41): `restarts` (after
//! failing, systemd's and the agent's), `since` (time in the current state, as `2m13s`) and
//! `exit` (how its main process last ended). Pure: the time comes from the caller.

use fleet_ops::model::StateView;
use std::time::Duration;

use super::wait::progress::elapsed;

/// The fields this module renders.
pub const FIELDS: [&str; 3] = ["exit", "restarts", "since"];

/// The cell of `field` (one of [`FIELDS`]) for `state`, `now` in microseconds since the epoch.
/// `-` for what the machine did not publish (an older agent, a unit never seen exiting).
pub fn cell(field: &str, state: &StateView, now: u64) -> String {
    match field {
        "restarts" => state.restarts.to_string(),
        "since" => state.since.map_or_else(
            || "-".to_owned(),
            |since| elapsed(Duration::from_micros(now.saturating_sub(since))),
        ),
        "exit" => state.exit.clone().unwrap_or_else(|| "-".to_owned()),
        other => unreachable!("field {other} is not a history field"),
    }
}

/// Now, in microseconds since the epoch.
pub fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> StateView {
        StateView {
            name: "a.service".parse().unwrap(),
            machine: "m1".parse().unwrap(),
            hash: None,
            load: "loaded".into(),
            active: "active".into(),
            sub: "running".into(),
            restart: 0,
            restart_pending: false,
            restarts: 0,
            since: None,
            exit: None,
        }
    }

    #[test]
    fn a_crash_looping_unit_shows_its_restarts_its_time_in_state_and_its_exit() {
        let now = 1_000_000_000;
        let s = StateView {
            restarts: 7,
            since: Some(now - 133_000_000),
            exit: Some("exit status 3".into()),
            ..state()
        };
        let cells: Vec<String> = ["restarts", "since", "exit"]
            .iter()
            .map(|f| cell(f, &s, now))
            .collect();
        assert_eq!(cells, ["7", "2m13s", "exit status 3"]);
    }

    #[test]
    fn what_a_machine_did_not_publish_is_a_dash_and_a_clock_behind_is_no_time() {
        let cells: Vec<String> = ["restarts", "since", "exit"]
            .iter()
            .map(|f| cell(f, &state(), 5))
            .collect();
        assert_eq!(cells, ["0", "-", "-"]);
        let ahead = StateView {
            since: Some(10),
            ..state()
        };
        assert_eq!(cell("since", &ahead, 5), "0s");
    }
}
