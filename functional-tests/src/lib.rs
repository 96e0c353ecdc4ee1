//! Real fleet clusters on one host, for functional tests and demos.
//!
//! A cluster is a real etcd (`/usr/bin/etcd`) on the host plus N machines. Each machine is a
//! real systemd booted as PID 1 of its own PID, mount, UTS, IPC and network namespaces, with
//! its own machine ID, hostname, IP on a per-cluster bridge, cgroup subtree, private /run and
//! /tmp, and a read-only view of the host's root filesystem. When asked, each machine runs
//! fleetd as an ordinary systemd service; fleetctl runs on the host.
//!
//! ```no_run
//! use fleet_functional_tests::{Cluster, ClusterSpec, FleetdSpec};
//! let cluster = Cluster::start(ClusterSpec::with_fleetd(3, FleetdSpec::default()))?;
//! let out = cluster.fleetctl(["list-machines"])?;
//! # anyhow::Ok(())
//! ```
//!
//! Everything the harness creates is named `flt<run id>...` and recorded in
//! `<workspace>/target/functional/<run id>/cluster.json` before it is created; dropping the
//! [`Cluster`] tears it down (also when a test panics), and [`cleanup_stale`] removes what runs
//! that died without tearing down left behind. The harness only ever kills processes it
//! started. Needs root. See `functional-tests/README.md`.

pub mod auth;
mod certs;
mod cgroup;
mod cleanup;
mod cluster;
mod cmd;
mod driver;
mod etcd;
mod fleetd;
mod machine;
pub mod metrics;
mod net;
mod proc;
mod reference;
mod registry;
mod state;
mod wait;

pub use certs::{ApiCerts, CLIENT_CN};
pub use cleanup::{cleanup_stale, leftovers};
pub use cluster::{Cluster, ClusterSpec};
pub use cmd::{OutputExt, Signal};
pub use driver::{DRIVER_VAR, Driver, inside_machine_args, serves};
pub use fleetd::{
    ENV_FILE as FLEETD_ENV_FILE, EtcdAuthSpec, FleetdSpec, MACHINE_BIN_DIR, UNIT as FLEETD_UNIT,
};
pub use machine::Machine;
pub use proc::ProcId;
pub use reference::{
    REFERENCE_DIR_VAR, reference_fleet_dir, reference_fleetctl, reference_fleetctl_ok,
    reference_fleetctl_run,
};
pub use registry::TestRegistry;
pub use state::{
    ClusterState, EtcdMember, EtcdState, MachineState, RunId, default_bin_dir, functional_dir,
    workspace_dir,
};
pub use wait::{wait_for, wait_for_value};
