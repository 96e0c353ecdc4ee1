//! [`Changes`] over the API: a wait follows fleetd's change stream (`GET /fleet/v1/changes`)
//! and reads the watched units, their states and the machines again after each change of
//! those parts, returning once that view differs from the last one, as the etcd side returns
//! only on a change that matters to the wait. Nothing polls.
//!
//! An API without the stream (a fleetd older than it, fleet's own), or one that refuses it
//! (all its streams taken), or a stream lost in the middle of a wait, leaves the wait to
//! poll as it did before the stream: every [`FIRST_POLL`] at first, then less often up to
//! the cluster's interval.

use fleet_core::UnitName;
use fleet_ops::{ChangeStream, Changes, Cluster, OpsError, StateFilter, WaitView};
use fleet_registry::Part;
use futures::{FutureExt, StreamExt};
use std::collections::BTreeSet;
use std::time::Duration;
use tracing::debug;

use super::changes::Unopened;
use super::http::{FAST_POLLS, FIRST_POLL, HttpCluster, NAMES_PER_REQUEST};

#[derive(Debug)]
pub struct HttpChanges {
    cluster: HttpCluster,
    names: BTreeSet<UnitName>,
    view: WaitView,
    source: Source,
}

/// What wakes the wait.
enum Source {
    /// fleetd's change stream.
    Stream(ChangeStream),
    /// Polls, the last of which waited `pause` ([`next_pause`]); `polls` made so far.
    Polls { pause: Duration, polls: u32 },
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Stream(_) => f.write_str("Stream"),
            Source::Polls { pause, polls } => f
                .debug_struct("Polls")
                .field("pause", pause)
                .field("polls", polls)
                .finish(),
        }
    }
}

/// The parts of the registry a wait view is read from.
const VIEWED: [Part; 3] = [Part::Units, Part::States, Part::Machines];

/// Whether a change of `parts` may change a wait view.
fn concerns_wait(parts: &BTreeSet<Part>) -> bool {
    VIEWED.iter().any(|p| parts.contains(p))
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
    /// Opens the stream before the first read, so that no change after that read is missed.
    pub(super) async fn start(
        cluster: HttpCluster,
        names: BTreeSet<UnitName>,
    ) -> Result<HttpChanges, OpsError> {
        let source = match cluster.open_changes().await {
            Ok(stream) => Source::Stream(stream),
            Err(Unopened::NotServed(error) | Unopened::Failed(error)) => {
                debug!(%error, "no change stream; the wait polls");
                polls(&cluster, names.len())
            }
        };
        let view = read(&cluster, &names).await?;
        Ok(HttpChanges {
            cluster,
            names,
            view,
            source,
        })
    }

    /// Waits until the view may have changed: a change of its parts on the stream (every one
    /// already there too, so that a burst costs one read), or the next poll.
    async fn woken(&mut self) {
        let lost = match &mut self.source {
            Source::Polls { pause, polls } => {
                tokio::time::sleep(*pause).await;
                *polls = polls.saturating_add(1);
                *pause = next_pause(*pause, *polls, self.cluster.poll_interval());
                return;
            }
            Source::Stream(stream) => loop {
                match stream.next().await {
                    Some(Ok(change)) if concerns_wait(&change.parts) => {
                        while let Some(Some(Ok(_))) = stream.next().now_or_never() {}
                        return;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => break error.to_string(),
                    None => break "the stream ended".to_owned(),
                }
            },
        };
        debug!(error = %lost, "the change stream was lost; the wait polls");
        self.source = polls(&self.cluster, self.names.len());
    }
}

/// Polling from its first pause, for a wait on `names` names.
fn polls(cluster: &HttpCluster, names: usize) -> Source {
    Source::Polls {
        pause: first_pause(names, cluster.poll_interval()),
        polls: 0,
    }
}

impl Changes for HttpChanges {
    fn view(&self) -> &WaitView {
        &self.view
    }

    async fn changed(&mut self) -> Result<(), OpsError> {
        loop {
            self.woken().await;
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
    fn only_a_change_of_units_states_or_machines_wakes_a_wait() {
        assert!(!concerns_wait(&BTreeSet::from([Part::Events])));
        assert!(!concerns_wait(&BTreeSet::new()));
        for part in VIEWED {
            assert!(concerns_wait(&BTreeSet::from([Part::Events, part])));
        }
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
