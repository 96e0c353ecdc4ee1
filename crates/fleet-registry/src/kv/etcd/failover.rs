//! Which etcd member a call goes to, and when a failed call is tried on the next one.
//!
//! etcd-client balances over every endpoint of one channel and fails a request when one of
//! them is unreachable (etcd-client issue #39). So each endpoint gets its own client here,
//! and calls follow etcd's client requirements instead: stay on an endpoint while it works,
//! move to the next on a transport failure or an unavailable member, and repeat a call there
//! only if that cannot apply it twice. [`verdict`] and [`another_round`] are that policy, pure
//! functions; [`Members`] holds the clients and the index of the current one and runs calls
//! by it. Nothing here logs an error it returns; a move to the next member is logged once.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::Instant;
use tracing::{debug, info};

use super::convert::Failure;
use super::login::{Login, no_user};

/// The kinds of call, by what a failure and a success of one mean. etcd's Go client makes the
/// same split for repeats (`repeatable` and `nonRepeatable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// Ranges, lease grants, keep-alives and revokes, answered through the raft leader: a
    /// repeat reads again, refreshes again, or at worst grants a lease nobody uses, which
    /// expires by itself.
    Read,
    /// Creating a watch: repeatable, but a member answers it alone, so an answer says nothing
    /// about its leader.
    Watch,
    /// Transactions that write: repeated only when the failure proves etcd never got them.
    Write,
}

impl Call {
    fn repeatable(self) -> bool {
        match self {
            Call::Read | Call::Watch => true,
            Call::Write => false,
        }
    }

    /// Whether an answer shows the member has a live leader.
    pub(super) fn proves_leader(self) -> bool {
        match self {
            Call::Read | Call::Write => true,
            Call::Watch => false,
        }
    }
}

/// What one failed try means for the call and for the calls after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The server answered (a refusal, a compaction, an unknown lease): it stands, and the
    /// member is fine.
    Stay,
    /// The member failed, but the call may have been applied (or its time is up): the error
    /// stands, and later calls start at the next member.
    MoveOn,
    /// The member failed and a repeat is safe: try the next member now.
    TryNext,
}

/// The pause before another round over every member, after the `round`th (0-based): 25 ms
/// doubling to 200 ms, what etcd's Go client waits between its retries. Only the deadline
/// bounds the rounds.
pub(super) fn round_pause(round: u32) -> Duration {
    ROUND_PAUSE_FIRST
        .saturating_mul(1 << round.min(3))
        .min(ROUND_PAUSE_MAX)
}

const ROUND_PAUSE_FIRST: Duration = Duration::from_millis(25);
const ROUND_PAUSE_MAX: Duration = Duration::from_millis(200);

/// How long a member that has not answered yet gets before a repeatable call is also sent to
/// the next one: a quarter of the call's time, at least 100 ms. Members that answered before
/// get the whole time (a large read may take long; repeating it everywhere would double the
/// load for nothing).
pub(super) fn hedge_delay(budget: Duration) -> Duration {
    (budget / 4).max(HEDGE_MIN)
}

const HEDGE_MIN: Duration = Duration::from_millis(100);

/// Whether a call that every member failed (each with [`Verdict::TryNext`]) gets another
/// round: yes while some member is up but unavailable (an election, a leader change), which
/// passes; no when no member could even be connected to, so a cluster that is down fails
/// the call at once instead of at its deadline.
pub(super) fn another_round(failures: &[Failure]) -> bool {
    failures.iter().any(|f| !matches!(f, Failure::NotSent(_)))
}

/// The failover policy.
pub(super) fn verdict(call: Call, failure: &Failure) -> Verdict {
    match failure {
        Failure::NotSent(_) | Failure::NoLeader(_) => Verdict::TryNext,
        Failure::Unreachable(_) if call.repeatable() => Verdict::TryNext,
        Failure::Unreachable(_) => Verdict::MoveOn,
        // A hung member uses the whole deadline; the next call goes elsewhere.
        Failure::Timeout => Verdict::MoveOn,
        // A refusal of RBAC or of the credentials is the cluster's answer, the same on every
        // member: never a reason to try another.
        Failure::Compacted(_)
        | Failure::LeaseNotFound(_)
        | Failure::PermissionDenied
        | Failure::AuthFailed(_)
        | Failure::Refused(_) => Verdict::Stay,
    }
}

/// One client per endpoint, in the configured order, and the member calls go to now.
pub(super) struct Members {
    members: Vec<Member>,
    current: AtomicUsize,
    /// 1 + the index of the member that last answered a call through its leader, 0 before.
    /// A write goes to a member only after it answered: a follower whose leader has just died
    /// forwards a write to the dead leader, where it is lost, and the write hangs until its
    /// deadline without a way to tell if it was applied. A linearizable read there first
    /// fails fast instead ("leader changed") and only succeeds once the member has a live
    /// leader.
    answered: AtomicUsize,
}

pub(super) struct Member {
    pub(super) endpoint: String,
    pub(super) client: Client,
    /// With credentials: this member's login (see [`Login`]).
    pub(super) login: Option<Login>,
}

impl Member {
    /// Runs `call` on this member's client, logged in first when there are credentials.
    /// A member that had auth off when this client logged in, and has it on now, refuses
    /// an anonymous call before handling it: logged in again, the call is repeated once.
    pub(super) async fn run<T, F, Fut>(&self, call: &F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let Some(login) = &self.login else {
            return call(self.client.clone())
                .await
                .map_err(|e| Failure::classify(&e));
        };
        login
            .ensure(&self.client)
            .await
            .map_err(|e| login_failure(&e))?;
        match call(self.client.clone()).await {
            Err(e) if no_user(&e) => {
                login.forget().await;
                login
                    .ensure(&self.client)
                    .await
                    .map_err(|e| login_failure(&e))?;
                call(self.client.clone())
                    .await
                    .map_err(|e| Failure::classify(&e))
            }
            answer => answer.map_err(|e| Failure::classify(&e)),
        }
    }
}

/// A failed login: the call itself was never sent, so a lost connection counts as a member
/// without a leader (up, nothing applied) and the call may go to the next member.
fn login_failure(err: &etcd_client::Error) -> Failure {
    match Failure::classify(err) {
        Failure::Unreachable(detail) => Failure::NoLeader(format!("authenticating: {detail}")),
        other => other,
    }
}

impl Members {
    /// `members` must not be empty.
    pub(super) fn new(members: Vec<Member>) -> Members {
        debug_assert!(!members.is_empty());
        Members {
            members,
            current: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    /// The index of the member a call starts at.
    pub(super) fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.members.len()
    }

    pub(super) fn get(&self, index: usize) -> &Member {
        &self.members[index % self.members.len()]
    }

    /// Makes `index` current after a `call` succeeded there.
    pub(super) fn settle(&self, index: usize, call: Call) {
        let index = index % self.members.len();
        self.current.store(index, Ordering::Relaxed);
        if call.proves_leader() {
            self.answered.store(index + 1, Ordering::Relaxed);
        }
    }

    /// Whether member `index` gave the last answer that went through a leader.
    pub(super) fn answered(&self, index: usize) -> bool {
        self.answered.load(Ordering::Relaxed) == index % self.members.len() + 1
    }

    /// Moves past `failed`, unless another call already moved: concurrent failures of one
    /// member move one step, not one per call.
    pub(super) fn move_past(&self, failed: usize) {
        let failed = failed % self.members.len();
        let next = (failed + 1) % self.members.len();
        let _ = self
            .current
            .compare_exchange(failed, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `call` under `deadline` by the rules of its kind: see [`repeatable`] and
    /// [`write`](Self::write).
    ///
    /// [`repeatable`]: Self::repeatable
    pub(super) async fn call<T, F, Fut>(
        &self,
        kind: Call,
        deadline: Instant,
        call: F,
    ) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match kind {
            Call::Read | Call::Watch => self.repeatable(kind, deadline, call).await,
            Call::Write => self.write(deadline, call).await,
        }
    }

    /// A repeatable call: on the current member, then on the next ones while [`verdict`]
    /// allows, each at most once per round; rounds repeat while [`another_round`] says and the
    /// deadline allows. A member that has not answered yet gets [`hedge_delay`]; past it the
    /// call is also sent to the next member, and the first answer wins (a hung member costs
    /// a fresh client that much, not its whole deadline). The error of a call that failed
    /// everywhere names every member's failure of the last round.
    async fn repeatable<T, F, Fut>(
        &self,
        kind: Call,
        deadline: Instant,
        call: F,
    ) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let count = self.len();
        let hedge = hedge_delay(deadline.saturating_duration_since(Instant::now()));
        let call = &call;
        let attempt = |index: usize| {
            let answer = tokio::time::timeout_at(deadline, self.get(index).run(call));
            async move {
                let result = match answer.await {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(failure)) => Err(failure),
                    Err(_) => Err(Failure::Timeout),
                };
                (index, result)
            }
        };
        let mut round = 0;
        // What the last whole round met: said instead of a timeout when the deadline cuts
        // the next round short (an HTTP server at the endpoint, say, not "timed out").
        let mut earlier: Vec<(usize, Failure)> = Vec::new();
        loop {
            let start = self.current();
            let mut failed: Vec<(usize, Failure)> = Vec::with_capacity(count);
            let mut running = FuturesUnordered::new();
            let mut started = 0;
            loop {
                if running.is_empty() {
                    if started == count {
                        break;
                    }
                    running.push(attempt((start + started) % count));
                    started += 1;
                }
                let newest = (start + started - 1) % count;
                let hedging = started < count && !self.answered(newest);
                let outcome = tokio::select! {
                    Some(outcome) = running.next() => outcome,
                    () = tokio::time::sleep(hedge), if hedging => {
                        debug!(endpoint = %self.get(newest).endpoint, "etcd member slow to answer; asking the next one too");
                        running.push(attempt((start + started) % count));
                        started += 1;
                        continue;
                    }
                };
                let (index, failure) = match outcome {
                    (index, Ok(value)) => {
                        self.settle(index, kind);
                        return Ok(value);
                    }
                    (index, Err(failure)) => (index, failure),
                };
                let verdict = verdict(kind, &failure);
                if verdict == Verdict::Stay {
                    return Err(failure);
                }
                self.failed(index, &failure, round);
                failed.push((index, failure));
                if verdict == Verdict::MoveOn && running.is_empty() {
                    return Err(self.merged(informative(failed, earlier)));
                }
                if verdict == Verdict::TryNext && !running.is_empty() && started < count {
                    running.push(attempt((start + started) % count));
                    started += 1;
                }
            }
            let pause = round_pause(round);
            let failures: Vec<Failure> = failed.iter().map(|(_, f)| f.clone()).collect();
            if !another_round(&failures) || Instant::now() + pause >= deadline {
                return Err(self.merged(informative(failed, earlier)));
            }
            debug!(round, pause = ?pause, "no etcd member available; trying every one again");
            tokio::time::sleep(pause).await;
            round += 1;
            earlier = failed;
        }
    }

    /// A write: only to a member that has answered through its leader (else [`probe`] first,
    /// a repeatable read that settles on the member that answers), and to the next member
    /// only when [`verdict`] says etcd never got it.
    async fn write<T, F, Fut>(&self, deadline: Instant, call: F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut failed: Vec<(usize, Failure)> = Vec::new();
        // Each member refusing it once, at most, per member that answered the probe.
        for _ in 0..2 * self.len() {
            if !self.answered(self.current()) {
                let probed = self.repeatable(Call::Read, deadline, probe).await;
                if let Err(failure) = probed {
                    failed.push((self.current(), failure));
                    return Err(self.merged(failed));
                }
            }
            let index = self.current();
            let failure = match tokio::time::timeout_at(deadline, self.get(index).run(&call)).await
            {
                Ok(Ok(value)) => {
                    self.settle(index, Call::Write);
                    return Ok(value);
                }
                Ok(Err(failure)) => failure,
                Err(_) => Failure::Timeout,
            };
            let verdict = verdict(Call::Write, &failure);
            if verdict == Verdict::Stay {
                return Err(failure);
            }
            self.failed(index, &failure, 0);
            failed.push((index, failure));
            if verdict == Verdict::MoveOn {
                return Err(self.merged(failed));
            }
        }
        Err(self.merged(failed))
    }

    /// Moves past a member that failed, and says so once per call.
    fn failed(&self, index: usize, failure: &Failure, round: u32) {
        self.move_past(index);
        if self.len() > 1 && round == 0 {
            // An outage is the caller's to log.
            info!(
                endpoint = %self.get(index).endpoint,
                failure = ?failure,
                "etcd member failed; moving to the next one"
            );
        }
    }

    /// One failure for a call that failed on each of `failed`: the last one's kind, with every
    /// member's detail when there were several.
    fn merged(&self, mut failed: Vec<(usize, Failure)>) -> Failure {
        if failed.len() == 1 {
            return failed.remove(0).1;
        }
        let detail = failed
            .iter()
            .map(|(index, f)| {
                let what = match f {
                    Failure::NotSent(d) | Failure::NoLeader(d) | Failure::Unreachable(d) => {
                        d.as_str()
                    }
                    Failure::Timeout => "timed out",
                    Failure::PermissionDenied => "permission denied",
                    Failure::Compacted(d)
                    | Failure::LeaseNotFound(d)
                    | Failure::AuthFailed(d)
                    | Failure::Refused(d) => d.as_str(),
                };
                format!("{}: {what}", self.get(*index).endpoint)
            })
            .collect::<Vec<_>>()
            .join("; ");
        match failed.pop().map(|(_, f)| f) {
            Some(Failure::NotSent(_)) => Failure::NotSent(detail),
            Some(Failure::NoLeader(_)) => Failure::NoLeader(detail),
            Some(Failure::Timeout) => Failure::Timeout,
            _ => Failure::Unreachable(detail),
        }
    }
}

/// A linearizable read of one key, counted only: it answers once the member has a live
/// leader (see [`failover::Members`]). A user who may not read that key is refused only
/// after etcd's linearizable read barrier (etcd 3.4 checks a range's permission after it),
/// so that refusal proves a live leader too.
async fn probe(client: Client) -> Result<(), etcd_client::Error> {
    let options = GetOptions::new().with_count_only();
    match client.kv_client().get("\0", Some(options)).await {
        Ok(_) => Ok(()),
        Err(e) if Failure::classify(&e) == Failure::PermissionDenied => Ok(()),
        Err(e) => Err(e),
    }
}

/// The failures to report: `failed`, unless the deadline timed out all of them and an
/// `earlier` round met something more telling.
fn informative(
    failed: Vec<(usize, Failure)>,
    earlier: Vec<(usize, Failure)>,
) -> Vec<(usize, Failure)> {
    let timed_out = |f: &[(usize, Failure)]| f.iter().all(|(_, f)| matches!(f, Failure::Timeout));
    if timed_out(&failed) && !earlier.is_empty() && !timed_out(&earlier) {
        earlier
    } else {
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_failures() -> Vec<Failure> {
        vec![
            Failure::NotSent("tcp connect error".into()),
            Failure::NoLeader("etcdserver: no leader".into()),
            Failure::Unreachable("connection reset".into()),
            Failure::Timeout,
            Failure::Compacted("compacted".into()),
            Failure::LeaseNotFound("lease not found".into()),
            Failure::Refused("too many operations".into()),
            Failure::PermissionDenied,
            Failure::AuthFailed("etcdserver: authentication failed".into()),
        ]
    }

    #[test]
    fn a_request_that_never_left_is_tried_on_the_next_member_whatever_it_is() {
        let failure = Failure::NotSent("tcp connect error".into());
        assert_eq!(verdict(Call::Read, &failure), Verdict::TryNext);
        assert_eq!(verdict(Call::Write, &failure), Verdict::TryNext);
    }

    #[test]
    fn a_deadline_that_cuts_a_round_short_reports_the_round_before() {
        let http = || vec![(0, Failure::Unreachable("HTTP/1 answer".into()))];
        let timed_out = || vec![(0, Failure::Timeout)];
        assert_eq!(informative(timed_out(), http()), http());
        assert_eq!(informative(timed_out(), Vec::new()), timed_out());
        assert_eq!(informative(timed_out(), timed_out()), timed_out());
        let mixed = vec![
            (0, Failure::Timeout),
            (1, Failure::NotSent("refused".into())),
        ];
        assert_eq!(informative(mixed.clone(), http()), mixed);
    }

    #[test]
    fn a_member_without_a_leader_never_applied_the_request() {
        let failure = Failure::NoLeader("etcdserver: no leader".into());
        assert_eq!(verdict(Call::Write, &failure), Verdict::TryNext);
    }

    #[test]
    fn another_round_waits_out_an_election_but_not_a_cluster_that_is_down() {
        let refused = Failure::NotSent("tcp connect error".into());
        let no_leader = Failure::NoLeader("etcdserver: no leader".into());
        assert!(!another_round(&[refused.clone(), refused.clone()]));
        assert!(another_round(&[refused.clone(), no_leader]));
        assert!(another_round(&[
            refused,
            Failure::Unreachable("leader changed".into())
        ]));
    }

    #[test]
    fn a_member_not_heard_from_gets_a_quarter_of_the_time_before_the_next_is_asked() {
        assert_eq!(
            hedge_delay(Duration::from_secs(3)),
            Duration::from_millis(750)
        );
        assert_eq!(
            hedge_delay(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(hedge_delay(Duration::from_millis(200)), HEDGE_MIN);
    }

    #[test]
    fn rounds_pause_longer_up_to_a_bound() {
        let pauses: Vec<u128> = (0..6).map(|r| round_pause(r).as_millis()).collect();
        assert_eq!(pauses, [25, 50, 100, 200, 200, 200]);
    }

    #[test]
    fn a_write_that_may_have_reached_a_failing_member_is_not_repeated() {
        let failure = Failure::Unreachable("etcdserver: leader changed".into());
        assert_eq!(verdict(Call::Write, &failure), Verdict::MoveOn);
        assert_eq!(verdict(Call::Read, &failure), Verdict::TryNext);
    }

    #[test]
    fn a_timeout_moves_later_calls_but_ends_this_one() {
        for call in [Call::Read, Call::Watch, Call::Write] {
            assert_eq!(verdict(call, &Failure::Timeout), Verdict::MoveOn);
        }
    }

    #[test]
    fn an_answer_from_the_server_keeps_the_member() {
        for failure in all_failures().into_iter().skip(4) {
            for call in [Call::Read, Call::Watch, Call::Write] {
                assert_eq!(verdict(call, &failure), Verdict::Stay, "{failure:?}");
            }
        }
    }
}
