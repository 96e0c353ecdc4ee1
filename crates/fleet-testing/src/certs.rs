//! [`TestCerts`]: a certificate authority and the certificates a TLS test etcd and its
//! clients use, made with the `openssl` command line tool.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use fleet_registry::kv::TlsFiles;

use crate::unique_dir;

/// Certificates for a TLS test etcd, made with the `openssl` command line tool: a certificate
/// authority, a server certificate for given IP addresses, a client certificate, and a second,
/// unrelated authority with a client certificate of its own (what a wrong CA looks like).
/// ECDSA P-256 keys: generating them takes milliseconds. Dropping it deletes the files.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Generates everything into a new directory under the test directory; the server
    /// certificate is valid for `server_ips` (its subject alternative names). Panics if
    /// `openssl` fails.
    pub fn generate(server_ips: &[IpAddr]) -> TestCerts {
        let certs = TestCerts {
            dir: unique_dir("certs"),
        };
        let san = server_ips
            .iter()
            .map(|ip| format!("IP:{ip}"))
            .collect::<Vec<_>>()
            .join(",");
        certs.authority("ca");
        certs.authority("other-ca");
        certs.leaf("server", "ca", "serverAuth,clientAuth", Some(&san));
        certs.leaf("client", "ca", "clientAuth", None);
        certs.leaf("other-client", "other-ca", "clientAuth", None);
        certs
    }

    /// The directory holding every file (`<name>.pem`, `<name>.key`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The certificate authority etcd trusts and its server certificate is signed by.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Another certificate authority, which signed neither the server's certificate nor the
    /// client's: a client trusting it must refuse the server.
    pub fn wrong_ca(&self) -> PathBuf {
        self.dir.join("other-ca.pem")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate of [`TestCerts::ca`], which etcd accepts.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// A client certificate of [`TestCerts::wrong_ca`], which etcd refuses.
    pub fn wrong_client_cert(&self) -> PathBuf {
        self.dir.join("other-client.pem")
    }

    pub fn wrong_client_key(&self) -> PathBuf {
        self.dir.join("other-client.key")
    }

    /// The files a client of a [`TestEtcd::start_tls`] server needs.
    pub fn client_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.ca()),
            cert_file: Some(self.client_cert()),
            key_file: Some(self.client_key()),
        }
    }

    fn issuer(&self) -> CertIssuer<'_> {
        CertIssuer {
            dir: &self.dir,
            days: 2,
        }
    }

    fn authority(&self, name: &str) {
        let subject = format!("/CN=fleet test {name}");
        self.issuer()
            .authority(name, &subject)
            .unwrap_or_else(|e| panic!("{e}"));
    }

    fn leaf(&self, name: &str, ca: &str, usage: &str, san: Option<&str>) {
        let subject = format!("/CN=fleet test {name}");
        let leaf = Leaf {
            name,
            subject: &subject,
            ca,
            usage,
            san,
        };
        self.issuer()
            .leaf(&self.dir, &leaf)
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Makes certificates with the `openssl` command line tool: authorities, and certificates they
/// sign, with ECDSA P-256 keys (generating one takes milliseconds). Every test certificate
/// is made here: a test etcd's ([`TestCerts`]) and the functional harness's (its API
/// listeners' and clients').
#[derive(Debug, Clone, Copy)]
pub struct CertIssuer<'a> {
    /// Where the authorities' files are (`<name>.pem`, `<name>.key`).
    pub dir: &'a Path,
    /// How long every certificate it makes is valid.
    pub days: u32,
}

/// A certificate for [`CertIssuer::leaf`] to make.
#[derive(Debug, Clone, Copy)]
pub struct Leaf<'a> {
    /// Its files are `<name>.pem` and `<name>.key`.
    pub name: &'a str,
    /// Its subject, in openssl's form (`/CN=…/O=…`).
    pub subject: &'a str,
    /// The authority that signs it: the name of its files in the issuer's directory.
    pub ca: &'a str,
    /// Its extended key usage (`serverAuth,clientAuth`).
    pub usage: &'a str,
    /// Its subject alternative names (`IP:10.0.0.1,IP:…`), if any.
    pub san: Option<&'a str>,
}

impl CertIssuer<'_> {
    /// A self-signed authority `<name>.pem`/`<name>.key` in the issuer's directory.
    pub fn authority(&self, name: &str, subject: &str) -> std::io::Result<()> {
        let file = |ext: &str| self.dir.join(format!("{name}.{ext}")).display().to_string();
        let (key, pem) = (file("key"), file("pem"));
        let days = self.days.to_string();
        openssl(&[
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
            &days,
            "-subj",
            subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])
    }

    /// `<dir>/<name>.pem` and `.key` as `leaf` says, signed by its authority. A serial number
    /// of its own (the nanoseconds of now), so that certificates made in any order, into any
    /// directory, never share one.
    pub fn leaf(&self, dir: &Path, leaf: &Leaf<'_>) -> std::io::Result<()> {
        let path = |ext: &str| {
            dir.join(format!("{}.{ext}", leaf.name))
                .display()
                .to_string()
        };
        let (key, csr, pem, ext) = (path("key"), path("csr"), path("pem"), path("ext"));
        let ca = |ext: &str| {
            let file = self.dir.join(format!("{}.{ext}", leaf.ca));
            file.display().to_string()
        };
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            leaf.subject,
        ])?;
        let mut extensions = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage={}\n",
            leaf.usage
        );
        if let Some(san) = leaf.san {
            extensions.push_str(&format!("subjectAltName={san}\n"));
        }
        fs::write(&ext, extensions)?;
        let days = self.days.to_string();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca("pem"),
            "-CAkey",
            &ca("key"),
            "-set_serial",
            &serial(),
            "-out",
            &pem,
            "-days",
            &days,
            "-extfile",
            &ext,
        ])?;
        let _ = fs::remove_file(&csr);
        let _ = fs::remove_file(&ext);
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

/// Runs `openssl args` (every path in them whole); its error output if it fails.
fn openssl(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("running openssl (scripts/deps.tsv installs it): {e}"),
            )
        })?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}
