//! Throwaway etcd servers for tests, and what other test support the crates share: a
//! dev-dependency only (`publish = false`), so no production crate links a test launcher.
//!
//! [`TestEtcd`] runs a real single-member etcd on loopback with its own free ports and its own
//! data directory (never under /tmp: a namespaced systemd in other tests may empty it), with
//! fast raft timings. It can be killed and restarted on the same ports and data to test
//! outages. Test code only: failures panic with the server's log attached.
//!
//! [`TestEtcd::start_tls`] serves clients over TLS and requires client certificates, with a
//! certificate authority, server and client certificates made by [`TestCerts::generate`]
//! (the `openssl` command line tool, on `PATH`).
//!
//! [`TestEtcdCluster`] runs several members, for tests of a member failing under a client.
//!
//! What the functional harness (functional-tests) shares with these launchers is here too:
//! [`free_ports`], the election timings ([`ETCD_FAST_ELECTIONS`]), etcd's HTTP side
//! ([`member_status`], [`post_json`]) and the certificate maker ([`CertIssuer`]).
//!
//! Modules: `etcd` (the single server and how every test etcd is launched), `cluster`,
//! `auth` (etcd's users and roles), `certs`, `gateway` (plain HTTP), `ports`, `registry`
//! (registry contents for the readers' tests).
//!
//! Environment: `$FLEET_TEST_DIR` is where data directories go (default
//! `<workspace>/target/test-etcd`), `$FLEET_TEST_ETCD` the etcd binary (default `etcd` on
//! `PATH`).

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use rand::Rng;

mod auth;
mod certs;
mod cluster;
mod etcd;
mod gateway;
mod ports;
mod registry;

pub use auth::ROOT_PASSWORD;
pub use certs::{CertIssuer, Leaf, TestCerts};
pub use cluster::TestEtcdCluster;
pub use etcd::{ETCD_FAST_ELECTIONS, Shaped, TestEtcd};
pub use gateway::{MemberStatus, http_exchange, member_status, post_json};
pub use ports::free_ports;
pub use registry::machine_running;

/// Makes each directory's name unique within the process.
static SERVERS: AtomicU32 = AtomicU32::new(0);

/// `$FLEET_TEST_DIR/<kind>-<unique>`, else `<workspace>/target/test-etcd/<kind>-<unique>`.
fn unique_dir(kind: &str) -> PathBuf {
    let base = std::env::var_os("FLEET_TEST_DIR").map_or_else(
        || {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/test-etcd"
            ))
        },
        PathBuf::from,
    );
    let name = format!(
        "{kind}-{}-{}-{:08x}",
        std::process::id(),
        SERVERS.fetch_add(1, Ordering::Relaxed),
        rand::rng().random::<u32>()
    );
    let dir = base.join(name);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    dir
}
