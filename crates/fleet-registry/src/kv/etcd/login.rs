//! Authentication of one member's client with etcd's username/password (issue 17).
//!
//! etcd-client authenticates in `Client::connect` when given a user, a round trip that would
//! make connecting fail while etcd is down. Instead every member's client connects
//! anonymously (lazily, as without credentials) and authenticates on its first call, within
//! that call's deadline: [`Login::ensure`]. A call refused with "invalid auth token" (the
//! token expired, or the member restarted) logs in again the same way and is repeated once. A login outlives the call that started it (see
//! [`Login::ensure`]). Simple tokens (etcd's default) are member-local
//! and lost on a restart, which is why each member's client logs in on its own.
//!
//! As etcd's Go client does, a member that answers "authentication is not enabled" is used
//! anonymously; should auth be enabled later, its first refusal for lack of a user
//! ("user name is empty") logs in again ([`Login::forget`]).

use etcd_client::{Client, Error as EtcdError};
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tracing::debug;

/// How long one login may take, whatever the deadline of the call that started it.
pub(super) const LOGIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The credentials of one member's client and whether it has logged in with them.
pub(super) struct Login {
    user: String,
    password: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// True once the member gave this client a token, or said auth is off.
    done: bool,
    /// The login under way: it outlives the call that started it.
    pending: Option<JoinHandle<Result<(), EtcdError>>>,
}

impl Login {
    pub(super) fn new(user: String, password: String) -> Login {
        Login {
            user,
            password,
            state: Mutex::new(State::default()),
        }
    }

    /// Logs `client` in unless it already is. Concurrent callers wait for one attempt; a
    /// failed attempt leaves the next caller to try again.
    ///
    /// The login runs on its own task, so a call whose deadline passes first leaves it to
    /// finish for the next one. etcd 3.4 checks a password with bcrypt (cost 10 by default,
    /// about 100 ms of its CPU): cut at a call's 1 s deadline while thousands of fleetds
    /// logged in at once, each login was paid for and thrown away, and tried again, so the
    /// queue never drained (issue 43's production-shaped bench).
    pub(super) async fn ensure(&self, client: &Client) -> Result<(), EtcdError> {
        let mut state = self.state.lock().await;
        if state.done {
            return Ok(());
        }
        let pending = state.pending.get_or_insert_with(|| {
            let creds = Some((self.user.clone(), self.password.clone()));
            let (mut client, user) = (client.clone(), self.user.clone());
            tokio::spawn(async move {
                let login = client.update_user(creds);
                match tokio::time::timeout(LOGIN_TIMEOUT, login).await {
                    Ok(Ok(())) => {
                        debug!(user = %user, "etcd client authenticated");
                        Ok(())
                    }
                    Ok(Err(e)) if auth_not_enabled(&e) => {
                        debug!(user = %user, "etcd authentication is not enabled; calls go anonymous");
                        Ok(())
                    }
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(EtcdError::InvalidArgs(format!(
                        "authenticating took more than {LOGIN_TIMEOUT:?}"
                    ))),
                }
            })
        });
        let outcome = pending.await;
        state.pending = None;
        match outcome {
            Ok(Ok(())) => {
                state.done = true;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(e) => Err(EtcdError::InvalidArgs(format!("authenticating: {e}"))),
        }
    }

    /// Makes the next [`ensure`](Self::ensure) log in again.
    pub(super) async fn forget(&self) {
        self.state.lock().await.done = false;
    }
}

/// gRPC status codes of etcd's authentication answers.
const INVALID_ARGUMENT: i32 = 3;
const FAILED_PRECONDITION: i32 = 9;
const UNAUTHENTICATED: i32 = 16;

fn status_is(err: &EtcdError, code: i32, text: &str) -> bool {
    matches!(err, EtcdError::GRpcStatus(s) if i32::from(s.code()) == code && s.message().contains(text))
}

/// "etcdserver: authentication is not enabled", the answer to a login on an etcd without auth.
fn auth_not_enabled(err: &EtcdError) -> bool {
    status_is(err, FAILED_PRECONDITION, "authentication is not enabled")
}

/// "etcdserver: user name is empty": auth is on and the request carried no token; or
/// "etcdserver: invalid auth token": the token expired, or the member restarted. Either way,
/// log in again.
pub(super) fn no_user(err: &EtcdError) -> bool {
    status_is(err, INVALID_ARGUMENT, "user name is empty")
        || status_is(err, UNAUTHENTICATED, "invalid auth token")
}
