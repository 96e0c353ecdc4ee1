//! fleetctl's commands as a library, for its binary (`main.rs`) and for the bench, which
//! creates units through the same submit path ([`commands::submit`]) instead of its own copy.
//! Every command reaches the cluster through [`fleet_ops::Cluster`] only, so it works, and
//! prints the same bytes, over the etcd driver and over fleet's API. The pure decisions of
//! `load` and `start` are [`plan`]'s.

pub mod cli;
pub mod commands;
pub mod completion;
pub mod credentials;
pub mod driver;
pub mod import;
pub mod local;
pub mod output;
pub mod plan;
pub mod ranges;
mod table;
pub mod terminal;
