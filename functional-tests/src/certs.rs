//! Certificates of the machines' TLS API listeners ([`crate::FleetdSpec::api_tls_port`]),
//! made with the `openssl` command line tool: one authority per cluster (`<run dir>/tls/`,
//! with a client certificate for fleetctl on the host), a server certificate per machine for
//! its IP. fleetd requires a client certificate of the same authority.
//!
//! A second authority (`other-ca.pem`) signs nothing a machine trusts or serves: a client
//! that trusts it must refuse every machine, and a client certificate it signs
//! ([`ApiCerts::foreign_client`]) is refused by every machine.
//!
//! fleetctl's client certificate is `CN=fleet functional client` ([`CLIENT_CN`]), which the
//! harness gives the API's admin role; [`ApiCerts::client`] issues more, with any CN and O
//! values, for the role tests.
//!
//! fleet-testing's [`CertIssuer`] makes every certificate, as it makes a test etcd's.

use anyhow::{Context, Result};
use fleet_testing::{CertIssuer, Leaf};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// The directory of a cluster's authority, below its run directory.
pub const DIR: &str = "tls";

/// The CN of fleetctl's client certificate.
pub const CLIENT_CN: &str = "fleet functional client";

/// Where a machine's files go inside it (its stage's `fleet/` is its `/run/fleet`).
pub const MACHINE_DIR: &str = "/run/fleet/tls";

/// A cluster's authority and fleetctl's client certificate, in one directory.
#[derive(Debug, Clone)]
pub struct ApiCerts {
    dir: PathBuf,
}

impl ApiCerts {
    /// The authority in `run_dir`, made first if it is not there yet.
    pub fn ensure(run_dir: &Path) -> Result<ApiCerts> {
        let certs = ApiCerts {
            dir: run_dir.join(DIR),
        };
        if !certs.ca().is_file() {
            std::fs::create_dir_all(&certs.dir)
                .with_context(|| format!("cannot create {}", certs.dir.display()))?;
            certs.authority("ca")?;
            certs.authority("other-ca")?;
            let subject = format!("/CN={CLIENT_CN}");
            certs.client_leaf("client", &subject, "ca")?;
        }
        Ok(certs)
    }

    /// The authority of every machine's certificate and of the client certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// An authority that signed nothing of the cluster's.
    pub fn wrong_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// fleetctl's TLS environment for the machines' APIs.
    pub fn fleetctl_env(&self) -> [(&'static str, PathBuf); 3] {
        [
            ("FLEETCTL_CA_FILE", self.ca()),
            ("FLEETCTL_CERT_FILE", self.client_cert()),
            ("FLEETCTL_KEY_FILE", self.client_key()),
        ]
    }

    /// A client certificate of the cluster's authority with subject `CN=<cn>` and one `O`
    /// per `orgs`, as `<name>.pem`/`<name>.key` in the authority's directory (made once):
    /// its paths, certificate first.
    pub fn client(&self, name: &str, cn: &str, orgs: &[&str]) -> Result<(PathBuf, PathBuf)> {
        self.issued(name, cn, orgs, "ca")
    }

    /// The same, signed by the other authority, which no machine trusts.
    pub fn foreign_client(&self, name: &str, cn: &str) -> Result<(PathBuf, PathBuf)> {
        self.issued(name, cn, &[], "other-ca")
    }

    fn issued(&self, name: &str, cn: &str, orgs: &[&str], ca: &str) -> Result<(PathBuf, PathBuf)> {
        let (pem, key) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        if !pem.is_file() {
            let subject: String = orgs
                .iter()
                .map(|o| format!("/O={o}"))
                .chain([format!("/CN={cn}")])
                .collect();
            self.client_leaf(name, &subject, ca)?;
        }
        Ok((pem, key))
    }

    /// Writes `server.pem`/`server.key` for `ip` and the authority's `ca.pem` into `dir`.
    pub fn machine(&self, dir: &Path, ip: Ipv4Addr) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let san = format!("IP:{ip}");
        let subject = "/CN=fleet functional server";
        // clientAuth too: fleetd presents it when it asks its peers (issue 36).
        let server = Leaf {
            name: "server",
            subject,
            ca: "ca",
            usage: "serverAuth,clientAuth",
            san: Some(&san),
        };
        self.issuer().leaf(dir, &server)?;
        std::fs::copy(self.ca(), dir.join("ca.pem"))?;
        Ok(())
    }

    fn issuer(&self) -> CertIssuer<'_> {
        CertIssuer {
            dir: &self.dir,
            days: 30,
        }
    }

    fn authority(&self, name: &str) -> Result<()> {
        let subject = format!("/CN=fleet functional {name}");
        Ok(self.issuer().authority(name, &subject)?)
    }

    /// `<name>.pem` and `.key` in the authority's directory, a client certificate with
    /// `subject` (openssl's `/CN=…/O=…`) signed by the authority `ca` (`ca` or `other-ca`).
    fn client_leaf(&self, name: &str, subject: &str, ca: &str) -> Result<()> {
        let leaf = Leaf {
            name,
            subject,
            ca,
            usage: "clientAuth",
            san: None,
        };
        Ok(self.issuer().leaf(&self.dir, &leaf)?)
    }
}
