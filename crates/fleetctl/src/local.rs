//! Reading the local files a unit named on the command line may take its content from: the
//! unit's own file, and (for an instance) the template file next to the argument. In which
//! order they and the registry's template are tried is `commands::submit`'s decision. Files
//! are read with a size cap and parsed before anything is written.

use anyhow::{Context, Result, anyhow, bail};
use fleet_core::unit_file::MAX_UNIT_FILE_BYTES;
use fleet_core::{UnitFile, UnitName};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The local file fleetctl looks for: the argument with `.service` appended unless it already
/// ends in a known unit type.
pub fn local_path(arg: &str) -> PathBuf {
    PathBuf::from(UnitName::with_default_type(arg))
}

/// The template file next to the argument: `dir/foo@.service` for `dir/foo@1.service`.
pub fn local_template_path(arg: &str, template: &UnitName) -> PathBuf {
    let path = local_path(arg);
    match path.parent() {
        Some(dir) => dir.join(template.as_str()),
        None => PathBuf::from(template.as_str()),
    }
}

/// Reads and parses a local unit file, or `None` if there is no such file.
pub fn read_unit_file(path: &Path) -> Result<Option<UnitFile>> {
    // Look before opening: a device may never end (or block, as a terminal does).
    match std::fs::metadata(path) {
        Ok(meta) => check_regular(path, &meta)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    // Again on what was opened, in case the path changed in between.
    check_regular(path, &meta)?;
    if meta.len() > MAX_UNIT_FILE_BYTES as u64 {
        bail!(
            "{}: unit file too large ({} bytes, max {MAX_UNIT_FILE_BYTES})",
            path.display(),
            meta.len()
        );
    }
    let mut bytes = Vec::new();
    file.take(MAX_UNIT_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    UnitFile::parse(&bytes)
        .map(Some)
        .map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// A local file read only to compare it with what the registry holds: `None` unless it is a
/// regular file that reads and parses. Such a read must never fail or block a command that
/// will not use the file, so a FIFO (which would wait for its writer), a directory, a device
/// or a file that does not parse is passed over.
pub fn peek_unit_file(path: &Path) -> Option<UnitFile> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    read_unit_file(path).ok().flatten()
}

fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        bail!("{} is a directory, not a unit file", path.display());
    }
    if kind.is_block_device() || kind.is_char_device() || kind.is_socket() {
        bail!("{} is a device or socket, not a unit file", path.display());
    }
    // A FIFO is read like a file (waiting for its writer, as `cat` does): generated unit
    // files can be handed over that way.
    Ok(())
}
