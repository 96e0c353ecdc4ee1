//! fleetctl's commands as a library, for its binary (`main.rs`) and for the bench, which
//! creates units through the same submit path ([`commands::submit`]) instead of its own copy.

pub mod cli;
pub mod commands;
pub mod local;
mod table;
