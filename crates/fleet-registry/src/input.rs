//! Checks of what a user configures for reaching the registry, made by fleetctl and fleetd
//! before anything connects: the etcd endpoints, the TLS files that go with them, and the key
//! prefix. Each refusal says what is wrong with which value; nothing here does I/O beyond
//! looking at the TLS files' metadata.

use crate::kv::{KvError, TlsFiles};
use std::path::Path;

/// The largest PEM file read (a CA bundle is a few hundred KiB at most): `/dev/zero` or a
/// wrong path must not be read until memory runs out.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// The longest key prefix accepted.
pub const MAX_PREFIX_BYTES: usize = 256;

/// A key prefix of the registry: starts with `/`, names something below etcd's root (never
/// `""` or `/`, which would put fleet's keys among everyone else's), no control character.
pub fn check_prefix(prefix: &str) -> Result<(), KvError> {
    let bad = |why: &str| Err(KvError::Config(format!("key prefix {prefix:?} {why}")));
    if prefix.len() > MAX_PREFIX_BYTES {
        return Err(KvError::Config(format!(
            "key prefix is longer than {MAX_PREFIX_BYTES} bytes"
        )));
    }
    if !prefix.starts_with('/') {
        return bad("must start with \"/\"");
    }
    if prefix.chars().all(|c| c == '/') {
        return bad("is etcd's root; name a directory such as /_coreos.com/fleet/");
    }
    if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("contains a space or a control character");
    }
    Ok(())
}

/// The endpoints: each an `http://` or `https://` URL with a host and a valid port, all of
/// one scheme; TLS files only with `https://`, each a readable regular file of at most
/// [`MAX_PEM_BYTES`].
pub fn check_endpoints(endpoints: &[String], tls: &TlsFiles) -> Result<(), KvError> {
    if endpoints.is_empty() {
        return Err(KvError::Config("no etcd endpoints configured".to_owned()));
    }
    for endpoint in endpoints {
        check_url(endpoint).map_err(|why| {
            KvError::Config(format!("etcd endpoint {:?}: {why}", shorten(endpoint)))
        })?;
    }
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https != 0 && https != endpoints.len() {
        return Err(KvError::Config(format!(
            "etcd endpoints mix https and http: {}",
            shorten(&endpoints.join(","))
        )));
    }
    let files = [&tls.ca_file, &tls.cert_file, &tls.key_file];
    let files = files.into_iter().flatten();
    if https == 0
        && let Some(first) = files.clone().next()
    {
        return Err(KvError::Config(format!(
            "TLS file {} given, but the etcd endpoints are http://; use https:// endpoints or drop the TLS files",
            first.display()
        )));
    }
    for file in files {
        check_pem_file(file)?;
    }
    Ok(())
}

/// Why `url` is not an etcd endpoint fleet can use, if it is not.
fn check_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("is not a URL; expected http://HOST:PORT or https://HOST:PORT".into());
    };
    match scheme {
        "http" | "https" => {}
        "unix" | "unixs" => return Err("unix sockets are not supported yet".into()),
        _ => {
            return Err(format!(
                "scheme {:?} is not supported; use http:// or https://",
                shorten(scheme)
            ));
        }
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !path.is_empty() {
        return Err("must not have a path".into());
    }
    if authority.contains('@') {
        return Err("must not hold a user name or password".into());
    }
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err("has no host".into());
    }
    let host_ok = host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ".-_:".contains(c));
    if !host_ok {
        return Err(format!(
            "host {:?} is not a host name or address",
            shorten(host)
        ));
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("port {:?} is not a port (1-65535)", shorten(port))),
        }
    }
    Ok(())
}

/// `host:port`, `host`, `[v6]:port` or `[v6]`.
fn split_host_port(authority: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err("has an unclosed \"[\" in its host".into());
        };
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err("has text after its IPv6 address".into()),
            },
        };
    }
    match authority.split_once(':') {
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((authority, None)),
    }
}

fn check_pem_file(path: &Path) -> Result<(), KvError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| KvError::Config(format!("cannot read {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(KvError::Config(format!(
            "cannot read {}: not a regular file",
            path.display()
        )));
    }
    if meta.len() > MAX_PEM_BYTES {
        return Err(KvError::Config(format!(
            "cannot read {}: {} bytes is too large for a PEM file (max {MAX_PEM_BYTES})",
            path.display(),
            meta.len()
        )));
    }
    Ok(())
}

/// The bytes of a PEM file: a regular file of at most [`MAX_PEM_BYTES`], read with that cap
/// (issue 38: `/dev/zero` named as a certificate must be refused, not read until memory runs
/// out). The error says which and why, without the contents.
pub fn read_pem_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "cannot read {}: not a regular file",
            path.display()
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(format!(
            "cannot read {}: too large for a PEM file (max {MAX_PEM_BYTES} bytes)",
            path.display()
        ));
    }
    Ok(bytes)
}

/// At most 200 characters of `s`, then `…`: a value echoed in an error stays readable.
pub fn shorten(s: &str) -> String {
    const MAX: usize = 200;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(e: &[&str]) -> Result<(), String> {
        let e: Vec<String> = e.iter().map(|s| (*s).to_owned()).collect();
        check_endpoints(&e, &TlsFiles::default()).map_err(|e| e.to_string())
    }

    #[test]
    fn refuses_endpoints_that_are_no_etcd_url_and_says_why() {
        let table: &[(&str, &str)] = &[
            ("ftp://h:1", "scheme \"ftp\" is not supported"),
            (
                "unix:///run/etcd.sock",
                "unix sockets are not supported yet",
            ),
            ("notaurl", "is not a URL"),
            ("http://h:99999", "port \"99999\" is not a port (1-65535)"),
            ("http://h:0", "port \"0\" is not a port"),
            ("http://h:", "port \"\" is not a port"),
            ("http://:2379", "has no host"),
            ("http://u:p@h:1", "must not hold a user name"),
            ("http://h:1/v3", "must not have a path"),
            ("http://h h:1", "is not a host name or address"),
            ("http://[::1:1", "unclosed"),
        ];
        for (e, want) in table {
            let got = endpoints(&[e]).unwrap_err();
            assert!(got.contains(want), "{e}: {got}");
        }
        assert!(
            endpoints(&["https://a:1", "http://b:2"])
                .unwrap_err()
                .contains("mix https and http")
        );
        assert!(endpoints(&[]).unwrap_err().contains("no etcd endpoints"));
    }

    #[test]
    fn accepts_the_usual_endpoints() {
        for e in [
            "http://127.0.0.1:2379",
            "https://etcd.example.com:2379",
            "http://[::1]:2379",
            "http://etcd",
            "http://etcd:2379/",
        ] {
            assert_eq!(endpoints(&[e]), Ok(()), "{e}");
        }
    }

    #[test]
    fn tls_files_need_https_and_must_be_small_regular_files() {
        let http = vec!["http://h:1".to_owned()];
        let https = vec!["https://h:1".to_owned()];
        let tls = |ca: &str| TlsFiles {
            ca_file: Some(ca.into()),
            ..TlsFiles::default()
        };
        let e = check_endpoints(&http, &tls("/etc/hostname")).unwrap_err();
        assert!(
            e.to_string().contains("the etcd endpoints are http://"),
            "{e}"
        );
        let e = check_endpoints(&https, &tls("/nonexistent/ca.pem")).unwrap_err();
        assert!(
            e.to_string().contains("cannot read /nonexistent/ca.pem"),
            "{e}"
        );
        let e = check_endpoints(&https, &tls("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    #[test]
    fn refuses_prefixes_at_etcds_root_or_with_control_characters() {
        for (p, want) in [
            ("", "must start with"),
            ("/", "is etcd's root"),
            ("//", "is etcd's root"),
            ("fleet/", "must start with"),
            ("/fleet\n", "control character"),
            ("/fl eet/", "a space"),
        ] {
            let e = check_prefix(p).unwrap_err().to_string();
            assert!(e.contains(want), "{p:?}: {e}");
        }
        assert!(check_prefix(&format!("/{}", "a".repeat(300))).is_err());
        assert!(check_prefix("/_coreos.com/fleet/").is_ok());
        assert!(check_prefix("/fleet_functional/smoke").is_ok());
    }

    #[test]
    fn shortens_long_values_to_200_characters() {
        assert_eq!(shorten("abc"), "abc");
        let long = "é".repeat(10_000);
        let short = shorten(&long);
        assert_eq!(short.chars().count(), 201);
        assert!(short.ends_with('…'));
    }

    /// Issue 38, item 1: a special file named as a certificate is refused at once, not read
    /// until memory runs out; a large regular file past the cap too.
    #[test]
    fn a_pem_file_is_a_regular_file_read_with_a_cap() {
        let e = read_pem_file(Path::new("/dev/zero")).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let dir = std::env::temp_dir().join(format!("fleet-pem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.pem");
        std::fs::write(&big, vec![b'a'; MAX_PEM_BYTES as usize + 1]).unwrap();
        let e = read_pem_file(&big).unwrap_err();
        assert!(e.contains("too large for a PEM file"), "{e}");
        let small = dir.join("small.pem");
        std::fs::write(&small, b"-----BEGIN X-----\n").unwrap();
        assert_eq!(read_pem_file(&small).unwrap(), b"-----BEGIN X-----\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
