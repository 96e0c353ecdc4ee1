//! fleetctl's commands as a library, for its binary (`main.rs`) and for the bench, which
//! creates units through the same submit path ([`commands::submit`]) instead of its own copy.
//! [`ops`] holds the pure decisions of the unit operations, which a fleet API can share
//! with the command line.

pub mod cli;
pub mod commands;
pub mod completion;
pub mod local;
pub mod ops;
mod table;
