//! Throwaway etcd servers for tests.
