//! [`Kv`](super::Kv) on a real etcd through etcd-client.

/// TLS client files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub request_timeout: std::time::Duration,
    pub tls: TlsFiles,
}

#[derive(Clone, Debug)]
pub struct EtcdKv {}
