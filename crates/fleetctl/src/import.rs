//! Taking over a live fleet v1 cluster: its registry read from etcd's v2 keyspace
//! ([`v2`]), and what to do with each unit it holds ([`plan`]), both pure. The command
//! (`fleetctl import-fleet`) reads, plans, prints, and writes what the plan says.

pub mod plan;
pub mod v2;

#[cfg(test)]
mod tests;
