//! fleetctl's library: what a fleet API could share with the command line. Today that is
//! [`ops`], the pure decisions of the unit operations; the commands themselves (etcd, local
//! files, printing) stay in the binary.

pub mod ops;
