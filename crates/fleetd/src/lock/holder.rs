//! Who holds fleetd's lock when `flock` says someone does, and whether fleetd gives way:
//! the pure half of [`super`]. The facts come from /proc (`/proc/locks`, `/proc/<pid>/status`,
//! `exe`, `cmdline`, `fd/`), read by the caller; here they are parsed and judged.
//!
//! The rule: fleetd refuses to start only for another live fleetd of its own user that has
//! the lock file open, because two fleetds on one runtime directory would manage the same
//! units. Any other holder (another user's process, a process that is not a fleetd, a PID that
//! has exited or now names someone else) is a squatter: fleetd takes the lock over, so that
//! nobody can keep it down by holding a file.

use std::fmt;
use std::path::{Path, PathBuf};

/// The name of fleetd's executable, as `/proc/<pid>/exe` shows it.
const FLEETD: &str = "fleetd";
/// What the kernel appends to `/proc/<pid>/exe` once the binary was replaced (an upgrade).
const DELETED: &str = " (deleted)";

/// A file as `/proc/locks` names it: the device's major and minor number and the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

impl FileId {
    /// From `stat`'s `st_dev` (glibc's encoding, as the kernel hands it out) and `st_ino`.
    pub fn from_stat(dev: u64, ino: u64) -> FileId {
        FileId {
            major: (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32,
            minor: (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32,
            ino,
        }
    }

    /// `MAJOR:MINOR:INODE` as `/proc/locks` prints it: hexadecimal device, decimal inode.
    fn parse(text: &str) -> Option<FileId> {
        let mut parts = text.split(':');
        let major = u32::from_str_radix(parts.next()?, 16).ok()?;
        let minor = u32::from_str_radix(parts.next()?, 16).ok()?;
        let ino = parts.next()?.parse().ok()?;
        parts
            .next()
            .is_none()
            .then_some(FileId { major, minor, ino })
    }
}

/// The PIDs that hold a `flock` lock on `file`, from the text of `/proc/locks`:
/// `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5308990 0 EOF`. A waiter (`1: -> FLOCK ...`) holds
/// nothing, and POSIX and OFD locks do not conflict with `flock`'s on Linux. A PID is 0 when
/// the holder is in a PID namespace this process cannot see.
pub fn flock_holders(proc_locks: &str, file: FileId) -> Vec<i64> {
    proc_locks
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.get(1) != Some(&"FLOCK") {
                return None;
            }
            let at = words.iter().position(|w| FileId::parse(w).is_some())?;
            let pid = words.get(at.checked_sub(1)?)?.parse().ok()?;
            (FileId::parse(words[at]) == Some(file)).then_some(pid)
        })
        .collect()
}

/// A field of `/proc/<pid>/status` (`Name`, `Uid`, ...), its value trimmed.
pub fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then_some(value.trim())
    })
}

/// The effective UID in `/proc/<pid>/status` (`Uid: real effective saved fs`): the one the
/// kernel checks file access against.
pub fn effective_uid(status: &str) -> Option<u32> {
    status_field(status, "Uid")?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A process's command line from `/proc/<pid>/cmdline` (arguments separated by NUL bytes),
/// with spaces, and no longer than `max` characters: for a log line.
pub fn command_line(cmdline: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(cmdline);
    let joined = text
        .split('\0')
        .filter(|a| !a.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    match joined.char_indices().nth(max) {
        Some((end, _)) => format!("{}...", &joined[..end]),
        None => joined,
    }
}

/// This fleetd, as the decision needs it.
#[derive(Debug, Clone)]
pub struct Me {
    pub pid: u32,
    pub uid: u32,
    /// `/proc/self/exe`, when readable.
    pub exe: Option<PathBuf>,
}

/// A live process that holds the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub uid: u32,
    /// Where `/proc/<pid>/exe` leads, when readable (another user's is not, unless root).
    pub exe: Option<PathBuf>,
    /// The kernel's short name (`Name:` in its status).
    pub name: String,
    /// Its command line, for the log.
    pub command: String,
    /// Whether one of its descriptors is the lock file: a PID in `/proc/locks` is the one
    /// that took the lock, which may have exited and been reused since.
    pub has_file_open: bool,
}

impl Process {
    /// Whether it runs a fleetd binary: by its executable's name (also once the binary was
    /// replaced by an upgrade), or the same executable as this one; by its short name when
    /// the executable cannot be read.
    fn is_fleetd(&self, own_exe: Option<&Path>) -> bool {
        let Some(exe) = &self.exe else {
            return self.name == FLEETD;
        };
        let shown = exe.to_string_lossy();
        let path = Path::new(shown.strip_suffix(DELETED).unwrap_or(&shown));
        path.file_name().is_some_and(|n| n == FLEETD) || own_exe == Some(path)
    }
}

/// One holder of the lock, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// Its PID is 0 in `/proc/locks`: a process of another PID namespace.
    Hidden,
    /// The process that took the lock has exited: a process it passed the descriptor to
    /// holds it now.
    Exited {
        pid: u32,
    },
    Running(Process),
}

/// Why a holder does not count as another fleetd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A process of another user: fleetd's runtime directory is its user's alone.
    OtherUser,
    /// A process of this user that is no fleetd.
    NotFleetd,
    /// The PID that took the lock now names a process without the file open (or this one).
    PidReused,
    Exited,
    Hidden,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::OtherUser => "a process of another user",
            Why::NotFleetd => "a process that is not a fleetd",
            Why::PidReused => "its PID names another process now",
            Why::Exited => "its process exited, the descriptor lives on elsewhere",
            Why::Hidden => "a process of another PID namespace",
        })
    }
}

/// A holder fleetd takes the lock from, with what is known of it for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Squatter {
    pub why: Why,
    pub pid: Option<u32>,
    pub uid: Option<u32>,
    pub command: Option<String>,
}

impl fmt::Display for Squatter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("an unseen process")?,
        }
        if let Some(uid) = self.uid {
            write!(f, " of uid {uid}")?;
        }
        if let Some(command) = &self.command {
            write!(f, " ({command})")?;
        }
        write!(f, ": {}", self.why)
    }
}

/// What fleetd does about a held lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Another fleetd of this user runs on this runtime directory: start no second one.
    Refuse { pid: u32 },
    /// Nobody that counts holds it: replace the lock file. `from` is empty when no holder is
    /// listed any more (it let go after fleetd's attempt).
    TakeOver { from: Vec<Squatter> },
}

/// The verdict on `holders`, the processes `/proc` shows holding the lock `me` wants.
pub fn decide(holders: &[Holder], me: &Me) -> Verdict {
    let mut from = Vec::new();
    for holder in holders {
        let squatter = match holder {
            Holder::Hidden => Squatter {
                why: Why::Hidden,
                pid: None,
                uid: None,
                command: None,
            },
            Holder::Exited { pid } => Squatter {
                why: Why::Exited,
                pid: Some(*pid),
                uid: None,
                command: None,
            },
            Holder::Running(p) => {
                let why = if p.uid != me.uid {
                    Why::OtherUser
                } else if !p.is_fleetd(me.exe.as_deref()) {
                    Why::NotFleetd
                } else if p.pid == me.pid || !p.has_file_open {
                    Why::PidReused
                } else {
                    return Verdict::Refuse { pid: p.pid };
                };
                Squatter {
                    why,
                    pid: Some(p.pid),
                    uid: Some(p.uid),
                    command: Some(p.command.clone()),
                }
            }
        };
        from.push(squatter);
    }
    Verdict::TakeOver { from }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: u32 = 0;
    const MY_PID: u32 = 4000;

    fn me() -> Me {
        Me {
            pid: MY_PID,
            uid: ME,
            exe: Some("/usr/bin/fleetd".into()),
        }
    }

    fn process(pid: u32, uid: u32, exe: &str) -> Process {
        Process {
            pid,
            uid,
            exe: Some(exe.into()),
            name: Path::new(exe)
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            command: exe.to_owned(),
            has_file_open: true,
        }
    }

    fn why(verdict: Verdict) -> Vec<Why> {
        match verdict {
            Verdict::TakeOver { from } => from.into_iter().map(|s| s.why).collect(),
            Verdict::Refuse { pid } => panic!("refused for pid {pid}"),
        }
    }

    const LOCK: FileId = FileId {
        major: 0,
        minor: 0x1a,
        ino: 1234,
    };

    #[test]
    fn finds_the_flock_holders_of_the_file_and_not_its_waiters_or_other_files() {
        let text = "\
1: FLOCK  ADVISORY  WRITE 11960 fe:00:5308990 0 EOF
2: FLOCK  ADVISORY  WRITE 321 00:1a:1234 0 EOF
2: -> FLOCK  ADVISORY  WRITE 777 00:1a:1234 0 EOF
3: POSIX  ADVISORY  WRITE 555 00:1a:1234 0 EOF
4: FLOCK  ADVISORY  READ 322 00:1a:1234 0 EOF
5: FLOCK  ADVISORY  READ 323 00:1b:1234 0 EOF
6: OFDLCK ADVISORY  READ -1 00:1a:1234 0 EOF
7: FLOCK  ADVISORY  WRITE 0 00:1a:1234 0 EOF
garbage
";
        assert_eq!(flock_holders(text, LOCK), vec![321, 322, 0]);
    }

    #[test]
    fn decodes_major_and_minor_numbers_as_the_kernel_prints_them() {
        // /dev/vda is 254:0 (`fe:00`); a tmpfs has major 0 and a minor that may pass 255.
        assert_eq!(
            FileId::from_stat(0xfe00, 7),
            FileId {
                major: 0xfe,
                minor: 0,
                ino: 7
            }
        );
        assert_eq!(FileId::from_stat(0x10_0023, 7).minor, 0x123);
        assert_eq!(
            FileId::parse("103:1ff:42"),
            Some(FileId {
                major: 0x103,
                minor: 0x1ff,
                ino: 42
            })
        );
        assert_eq!(FileId::parse("<none>"), None);
    }

    #[test]
    fn reads_the_effective_uid_and_the_name_from_a_status_file() {
        let status =
            "Name:\tflock\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t65534\t65534\t65534\n";
        assert_eq!(effective_uid(status), Some(65534));
        assert_eq!(status_field(status, "Name"), Some("flock"));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_command_line_is_shown_with_spaces_and_cut_short() {
        assert_eq!(
            command_line(b"flock\0/run/fleet/fleetd.lock\0cat\0", 80),
            "flock /run/fleet/fleetd.lock cat"
        );
        assert_eq!(command_line(b"abcdef\0", 3), "abc...");
    }

    #[test]
    fn another_fleetd_of_the_same_user_with_the_file_open_is_refused() {
        let holder = Holder::Running(process(42, ME, "/usr/bin/fleetd"));
        assert_eq!(decide(&[holder], &me()), Verdict::Refuse { pid: 42 });
    }

    #[test]
    fn a_fleetd_whose_binary_was_upgraded_away_is_still_a_fleetd() {
        let holder = Holder::Running(process(42, ME, "/usr/bin/fleetd (deleted)"));
        assert_eq!(decide(&[holder], &me()), Verdict::Refuse { pid: 42 });
    }

    #[test]
    fn a_fleetd_elsewhere_or_of_the_same_binary_under_another_name_is_a_fleetd() {
        let elsewhere = Holder::Running(process(42, ME, "/opt/fleet/bin/fleetd"));
        assert_eq!(decide(&[elsewhere], &me()), Verdict::Refuse { pid: 42 });
        let renamed = Me {
            exe: Some("/usr/local/bin/fleetd-1.2".into()),
            ..me()
        };
        let same = Holder::Running(process(42, ME, "/usr/local/bin/fleetd-1.2"));
        assert_eq!(decide(&[same], &renamed), Verdict::Refuse { pid: 42 });
    }

    #[test]
    fn a_process_of_another_user_is_taken_over_even_when_it_is_a_fleetd() {
        let other = Holder::Running(process(42, 65534, "/usr/bin/fleetd"));
        assert_eq!(why(decide(&[other], &me())), [Why::OtherUser]);
    }

    #[test]
    fn a_process_of_the_same_user_that_is_no_fleetd_is_taken_over() {
        let flock = Holder::Running(process(42, ME, "/usr/bin/flock"));
        let Verdict::TakeOver { from } = decide(&[flock], &me()) else {
            panic!("refused")
        };
        assert_eq!(
            from,
            [Squatter {
                why: Why::NotFleetd,
                pid: Some(42),
                uid: Some(ME),
                command: Some("/usr/bin/flock".into()),
            }]
        );
        assert_eq!(
            from[0].to_string(),
            "pid 42 of uid 0 (/usr/bin/flock): a process that is not a fleetd"
        );
    }

    #[test]
    fn a_fleetd_without_the_file_open_holds_a_reused_pid_and_is_taken_over() {
        let mut reused = process(42, ME, "/usr/bin/fleetd");
        reused.has_file_open = false;
        assert_eq!(
            why(decide(&[Holder::Running(reused)], &me())),
            [Why::PidReused]
        );
        // This very process only opened the file: the PID is a former process's.
        let this = Holder::Running(process(MY_PID, ME, "/usr/bin/fleetd"));
        assert_eq!(why(decide(&[this], &me())), [Why::PidReused]);
    }

    #[test]
    fn an_exited_or_hidden_holder_is_taken_over() {
        let holders = [Holder::Exited { pid: 42 }, Holder::Hidden];
        assert_eq!(why(decide(&holders, &me())), [Why::Exited, Why::Hidden]);
    }

    #[test]
    fn one_fleetd_among_shared_holders_is_enough_to_refuse() {
        let holders = [
            Holder::Running(process(41, 65534, "/usr/bin/flock")),
            Holder::Running(process(42, ME, "/usr/bin/fleetd")),
        ];
        assert_eq!(decide(&holders, &me()), Verdict::Refuse { pid: 42 });
    }

    #[test]
    fn an_unreadable_executable_falls_back_to_the_short_name() {
        let mut p = process(42, ME, "/usr/bin/fleetd");
        p.exe = None;
        assert_eq!(
            decide(&[Holder::Running(p.clone())], &me()),
            Verdict::Refuse { pid: 42 }
        );
        p.name = "sleep".into();
        assert_eq!(why(decide(&[Holder::Running(p)], &me())), [Why::NotFleetd]);
    }

    #[test]
    fn no_holder_left_is_a_take_over_from_nobody() {
        assert_eq!(decide(&[], &me()), Verdict::TakeOver { from: vec![] });
    }
}
