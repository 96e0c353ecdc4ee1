//! Certificates of the machines' TLS API listeners ([`crate::FleetdSpec::api_tls_port`]),
//! made with the `openssl` command line tool: one authority per cluster (`<run dir>/tls/`,
//! with a client certificate for fleetctl on the host), a server certificate per machine for
//! its IP. fleetd requires a client certificate of the same authority.
//!
//! A second authority (`other-ca.pem`) signs nothing a machine trusts or serves: a client
//! that trusts it must refuse every machine.

use anyhow::{Context, Result, bail};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The directory of a cluster's authority, below its run directory.
pub const DIR: &str = "tls";

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
            certs.leaf(&certs.dir, "client", "clientAuth", None)?;
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

    /// Writes `server.pem`/`server.key` for `ip` and the authority's `ca.pem` into `dir`.
    pub fn machine(&self, dir: &Path, ip: Ipv4Addr) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        self.leaf(dir, "server", "serverAuth", Some(&format!("IP:{ip}")))?;
        std::fs::copy(self.ca(), dir.join("ca.pem"))?;
        Ok(())
    }

    fn authority(&self, name: &str) -> Result<()> {
        let key = format!("{name}.key");
        let pem = format!("{name}.pem");
        let subject = format!("/CN=fleet functional {name}");
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &pem,
                "-days",
                "30",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )
    }

    /// `<dir>/<name>.pem` and `.key`, signed by the authority.
    fn leaf(&self, dir: &Path, name: &str, usage: &str, san: Option<&str>) -> Result<()> {
        let key = dir.join(format!("{name}.key"));
        let csr = dir.join(format!("{name}.csr"));
        let pem = dir.join(format!("{name}.pem"));
        let ext = dir.join(format!("{name}.ext"));
        let subject = format!("/CN=fleet functional {name}");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key.display().to_string(),
                "-out",
                &csr.display().to_string(),
                "-subj",
                &subject,
            ],
        )?;
        let mut extensions = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage={usage}\n"
        );
        if let Some(san) = san {
            extensions.push_str(&format!("subjectAltName={san}\n"));
        }
        std::fs::write(&ext, extensions)?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr.display().to_string(),
                "-CA",
                &self.ca().display().to_string(),
                "-CAkey",
                &self.dir.join("ca.key").display().to_string(),
                "-set_serial",
                &serial(),
                "-out",
                &pem.display().to_string(),
                "-days",
                "30",
                "-extfile",
                &ext.display().to_string(),
            ],
        )?;
        let _ = std::fs::remove_file(&csr);
        let _ = std::fs::remove_file(&ext);
        Ok(())
    }
}

/// A serial number of its own for each certificate (the nanoseconds of now).
fn serial() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(1);
    format!("{nanos}")
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running openssl (scripts/deps.tsv installs it)")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}
