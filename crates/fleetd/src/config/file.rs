//! The file layer of fleetd's configuration: fleet's `key=value` lines (`--config PATH`, or
//! `/etc/fleet/fleet.conf` if it exists), the lowest of the layers. It only reads text and
//! where each value came from; which keys exist and what they mean is `config`'s.

use anyhow::{Context, Result, bail};
use fleet_registry::input::shorten;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::Raw;

pub const DEFAULT_CONFIG_FILE: &str = "/etc/fleet/fleet.conf";

/// The largest config file read: `--config /dev/zero` must not exhaust memory.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;

/// Reads `key=value` lines (fleet's INI without sections; `#`/`;` comments).
pub fn parse_file(path: &Path, text: &str) -> Result<BTreeMap<String, Raw>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            bail!(
                "{}:{}: expected key=value, found {:?}",
                path.display(),
                i + 1,
                shorten(line)
            );
        };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.insert(
            k.trim().to_owned(),
            Raw {
                value: v.to_owned(),
                source: format!("{}:{}", path.display(), i + 1),
            },
        );
    }
    Ok(out)
}

/// Loads the file layer: `--config` must exist; the default file is optional.
pub fn load_file(explicit: Option<&Path>) -> Result<BTreeMap<String, Raw>> {
    let (path, required) = match explicit {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(DEFAULT_CONFIG_FILE), false),
    };
    match read_capped(&path) {
        Ok(text) => parse_file(&path, &text),
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e).with_context(|| format!("reading config file {}", path.display())),
    }
}

/// Reads a config file of at most [`MAX_CONFIG_BYTES`]; a device or socket is refused before
/// it is opened (a terminal would block, `/dev/zero` never ends). A FIFO is read as `cat`
/// reads it, waiting for its writer.
fn read_capped(path: &Path) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path)?.file_type();
    if kind.is_dir() || kind.is_block_device() || kind.is_char_device() || kind.is_socket() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|_| Error::new(ErrorKind::InvalidData, "not valid UTF-8"))
}
