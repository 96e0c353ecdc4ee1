//! The cluster registry in etcd v3. Every etcd call in the project lives in this crate.

pub mod kv;
#[cfg(feature = "test-etcd")]
pub mod testing;
