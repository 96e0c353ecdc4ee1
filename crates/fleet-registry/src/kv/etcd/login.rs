//! Authentication of one member's client with etcd's username/password (issue 17).
//!
//! etcd-client authenticates in `Client::connect` when given a user, a round trip that would
//! make connecting fail while etcd is down. Instead every member's client connects
//! anonymously (lazily, as without credentials) and authenticates on its first call, within
//! that call's deadline: [`Login::ensure`]. From then on etcd-client refreshes an expired
//! token by itself (`with_auto_token_refresh`): a call refused with "invalid auth token" is
//! authenticated again and repeated once. Simple tokens (etcd's default) are member-local
//! and lost on a restart, which is why each member's client logs in on its own.
//!
//! As etcd's Go client does, a member that answers "authentication is not enabled" is used
//! anonymously; should auth be enabled later, its first refusal for lack of a user
//! ("user name is empty") logs in again ([`Login::forget`]).

use etcd_client::{Client, Error as EtcdError};
use tokio::sync::Mutex;
use tracing::debug;

/// The credentials of one member's client and whether it has logged in with them.
pub(super) struct Login {
    user: String,
    password: String,
    /// True once the member gave this client a token, or said auth is off.
    done: Mutex<bool>,
}

impl Login {
    pub(super) fn new(user: String, password: String) -> Login {
        Login {
            user,
            password,
            done: Mutex::new(false),
        }
    }

    /// Logs `client` in unless it already is. Concurrent callers wait for one attempt; a
    /// failed attempt leaves the next caller to try again.
    pub(super) async fn ensure(&self, client: &Client) -> Result<(), EtcdError> {
        let mut done = self.done.lock().await;
        if *done {
            return Ok(());
        }
        let creds = Some((self.user.clone(), self.password.clone()));
        match client.clone().update_user(creds).await {
            Ok(()) => {
                debug!(user = %self.user, "etcd client authenticated");
            }
            Err(e) if auth_not_enabled(&e) => {
                debug!(user = %self.user, "etcd authentication is not enabled; calls go anonymous");
            }
            Err(e) => return Err(e),
        }
        *done = true;
        Ok(())
    }

    /// Makes the next [`ensure`](Self::ensure) log in again.
    pub(super) async fn forget(&self) {
        *self.done.lock().await = false;
    }
}

/// gRPC status codes of etcd's authentication answers.
const INVALID_ARGUMENT: i32 = 3;
const FAILED_PRECONDITION: i32 = 9;

fn status_is(err: &EtcdError, code: i32, text: &str) -> bool {
    matches!(err, EtcdError::GRpcStatus(s) if i32::from(s.code()) == code && s.message().contains(text))
}

/// "etcdserver: authentication is not enabled", the answer to a login on an etcd without auth.
fn auth_not_enabled(err: &EtcdError) -> bool {
    status_is(err, FAILED_PRECONDITION, "authentication is not enabled")
}

/// "etcdserver: user name is empty": auth is on and the request carried no token.
pub(super) fn no_user(err: &EtcdError) -> bool {
    status_is(err, INVALID_ARGUMENT, "user name is empty")
}
