//! [`Changes`] over the API: fleet's API has no watch, so a wait polls. Each poll reads the
//! watched units, their states and the machines, and returns once that view differs from the
//! last one, as the etcd side returns only on a change that matters to the wait.

use fleet_core::UnitName;
use fleet_ops::{Changes, Cluster, OpsError, StateFilter, WaitView};
use std::collections::BTreeSet;
use std::time::Duration;

use super::http::{FAST_POLLS, FIRST_POLL, HttpCluster, NAMES_PER_REQUEST};

#[derive(Debug)]
pub struct HttpChanges {
    cluster: HttpCluster,
    names: BTreeSet<UnitName>,
    view: WaitView,
    /// How long the next poll waits ([`next_pause`]).
    pause: Duration,
    /// Polls made so far.
    polls: u32,
}

/// The pause before the poll after `polls` polls, the last of which waited `pause`: the
/// same for the first [`FAST_POLLS`], then twice as long each time, up to `interval`. A wait
/// of many units reads whole listings on each poll, so it polls at `interval` from the start.
fn next_pause(pause: Duration, polls: u32, interval: Duration) -> Duration {
    if polls < FAST_POLLS {
        pause.min(interval)
    } else {
        (pause * 2).min(interval)
    }
}

/// The first pause of a wait on `names`: [`FIRST_POLL`], or `interval` when it is shorter
/// or when the names are too many for one request.
fn first_pause(names: usize, interval: Duration) -> Duration {
    if names > NAMES_PER_REQUEST {
        interval
    } else {
        FIRST_POLL.min(interval)
    }
}

impl HttpChanges {
    pub(super) async fn start(
        cluster: HttpCluster,
        names: BTreeSet<UnitName>,
    ) -> Result<HttpChanges, OpsError> {
        let view = read(&cluster, &names).await?;
        let pause = first_pause(names.len(), cluster.poll_interval());
        Ok(HttpChanges {
            cluster,
            names,
            view,
            pause,
            polls: 0,
        })
    }
}

impl Changes for HttpChanges {
    fn view(&self) -> &WaitView {
        &self.view
    }

    async fn changed(&mut self) -> Result<(), OpsError> {
        loop {
            tokio::time::sleep(self.pause).await;
            self.polls = self.polls.saturating_add(1);
            self.pause = next_pause(self.pause, self.polls, self.cluster.poll_interval());
            let next = read(&self.cluster, &self.names).await?;
            if next != self.view {
                self.view = next;
                return Ok(());
            }
        }
    }

    fn names(&self) -> &BTreeSet<UnitName> {
        &self.names
    }
}

/// The wait view of `names` now, built as the etcd side builds it ([`WaitView::of`]). Many
/// names (more than one request asks for) are read as whole listings and picked there: three
/// requests per poll instead of two per 500 units.
async fn read(cluster: &HttpCluster, names: &BTreeSet<UnitName>) -> Result<WaitView, OpsError> {
    let (units, states) = if names.len() > NAMES_PER_REQUEST {
        let units = cluster.units(None).await?.units;
        let states = cluster.states(&StateFilter::default()).await?.states;
        (units, states)
    } else {
        let units = cluster.units(Some(names)).await?.units;
        (units, cluster.states_of(names).await?)
    };
    let units = units.into_iter().map(|v| (v.name().clone(), v.status));
    let machines = cluster.machines().await?.machines;
    Ok(WaitView::of(names, units, states, machines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_polls_often_at_first_then_less_often_up_to_the_interval() {
        let interval = Duration::from_millis(250);
        let mut pause = first_pause(1, interval);
        let mut pauses = vec![pause];
        for polls in 1..15 {
            pause = next_pause(pause, polls, interval);
            pauses.push(pause);
        }
        let ms: Vec<u128> = pauses.iter().map(Duration::as_millis).collect();
        let mut expected = vec![20; FAST_POLLS as usize];
        expected.extend([40, 80, 160, 250, 250]);
        assert_eq!(ms, expected);
    }

    #[test]
    fn a_wait_of_many_units_or_a_short_interval_polls_at_the_interval() {
        let interval = Duration::from_millis(250);
        assert_eq!(first_pause(NAMES_PER_REQUEST + 1, interval), interval);
        let short = Duration::from_millis(10);
        assert_eq!(first_pause(1, short), short);
        assert_eq!(next_pause(short, 1, short), short);
        assert_eq!(next_pause(short, FAST_POLLS + 1, short), short);
    }
}
