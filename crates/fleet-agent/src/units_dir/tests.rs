use super::*;
use std::os::unix::fs::symlink;

/// A scratch directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let path = std::env::temp_dir().join(format!(
            "fleet-agent-units-dir-{test}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }

    fn open(&self) -> UnitsDir {
        UnitsDir::open(self.0.join("units"), self.0.join("runtime")).unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn name(s: &str) -> UnitName {
    s.parse().unwrap()
}

fn unit(text: &str) -> UnitFile {
    UnitFile::parse(text.as_bytes()).unwrap()
}

#[test]
fn creates_the_directory_with_mode_0700() {
    let scratch = Scratch::new("create");
    let dir = scratch.open();
    let mode = fs::metadata(dir.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700 & !current_umask());
}

#[test]
fn writes_canonical_text_with_mode_0600_and_lists_its_hash() {
    let scratch = Scratch::new("write");
    let dir = scratch.open();
    let file = unit("[Service]\n  ExecStart = /bin/true  \n");
    assert_eq!(
        dir.write(&name("a.service"), &file).unwrap(),
        Written::Replaced { had_install: false }
    );
    let path = dir.file_path(&name("a.service"));
    assert_eq!(fs::read_to_string(&path).unwrap(), file.canonical());
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let listed = dir.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, name("a.service"));
    assert_eq!(*listed[0].content.as_ref().unwrap(), file.hash());
    assert!(!listed[0].linked);
}

#[test]
fn lists_only_the_named_files_as_the_whole_listing_does() {
    let scratch = Scratch::new("list-of");
    let dir = scratch.open();
    dir.write(&name("a.service"), &unit("[Service]\nExecStart=/bin/a\n"))
        .unwrap();
    dir.write(&name("b.service"), &unit("[Service]\nExecStart=/bin/b\n"))
        .unwrap();
    fs::write(dir.file_path(&name("c.service")), "[not a unit] x").unwrap();
    fs::create_dir(dir.file_path(&name("d.service"))).unwrap();
    let asked = [
        name("c.service"),
        name("a.service"),
        name("gone.service"),
        name("d.service"),
        name("a.service"),
    ];
    let some = dir.list_of(&asked).unwrap();
    let all = dir.list().unwrap();
    let view = |units: &[InstalledUnit]| -> Vec<(String, Option<UnitHash>, bool)> {
        units
            .iter()
            .map(|u| {
                (
                    u.name.to_string(),
                    u.content.as_ref().ok().copied(),
                    u.linked,
                )
            })
            .collect()
    };
    let expected: Vec<_> = view(&all)
        .into_iter()
        .filter(|(n, _, _)| n == "a.service" || n == "c.service")
        .collect();
    assert_eq!(view(&some), expected);
    assert!(some[1].content.is_err(), "c.service does not parse");
}

#[test]
fn leaves_an_identical_file_alone() {
    let scratch = Scratch::new("unchanged");
    let dir = scratch.open();
    let file = unit("[Service]\nExecStart=/bin/true\n");
    dir.write(&name("a.service"), &file).unwrap();
    assert_eq!(
        dir.write(&name("a.service"), &file).unwrap(),
        Written::Unchanged
    );
    let other = unit("[Service]\nExecStart=/bin/false\n");
    assert_eq!(
        dir.write(&name("a.service"), &other).unwrap(),
        Written::Replaced { had_install: false }
    );
    assert_eq!(
        *dir.list().unwrap()[0].content.as_ref().unwrap(),
        other.hash()
    );
}

#[test]
fn says_when_the_file_it_replaced_had_an_install_section() {
    let scratch = Scratch::new("install");
    let dir = scratch.open();
    let enabled = unit("[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=a.target\n");
    dir.write(&name("a.service"), &enabled).unwrap();
    let plain = unit("[Service]\nExecStart=/bin/false\n");
    assert_eq!(
        dir.write(&name("a.service"), &plain).unwrap(),
        Written::Replaced { had_install: true }
    );
}

#[test]
fn reports_unparseable_files_without_failing_the_others() {
    let scratch = Scratch::new("unparseable");
    let dir = scratch.open();
    fs::write(dir.path().join("bad.service"), "[Service] garbage\n").unwrap();
    dir.write(
        &name("good.service"),
        &unit("[Service]\nExecStart=/bin/true\n"),
    )
    .unwrap();
    let listed = dir.list().unwrap();
    let names: Vec<_> = listed.iter().map(|u| u.name.to_string()).collect();
    assert_eq!(names, ["bad.service", "good.service"]);
    assert!(matches!(listed[0].content, Err(UnitFileError::Parse(_))));
    assert!(listed[1].content.is_ok());
}

#[test]
fn ignores_and_never_touches_files_that_are_not_unit_names() {
    let scratch = Scratch::new("foreign");
    let dir = scratch.open();
    fs::write(dir.path().join("README"), "mine").unwrap();
    fs::write(dir.path().join("notes.txt"), "mine too").unwrap();
    fs::create_dir(dir.path().join("sub.service")).unwrap();
    assert!(dir.list().unwrap().is_empty());
    assert!(dir.list().unwrap().is_empty());
    drop(dir);
    let _reopened = scratch.open();
    assert_eq!(
        fs::read_to_string(scratch.0.join("units/README")).unwrap(),
        "mine"
    );
    assert!(scratch.0.join("units/notes.txt").exists());
}

#[test]
fn removes_leftover_temporary_files_when_opened() {
    let scratch = Scratch::new("temp");
    let dir = scratch.open();
    let temp = dir.path().join(format!("{TEMP_PREFIX}1-0"));
    fs::write(&temp, "half").unwrap();
    assert!(dir.list().unwrap().is_empty());
    drop(dir);
    scratch.open();
    assert!(!temp.exists());
}

#[test]
fn sees_the_runtime_link_to_its_file() {
    let scratch = Scratch::new("link");
    let dir = scratch.open();
    let a = name("a.service");
    dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
        .unwrap();
    fs::create_dir_all(scratch.0.join("runtime")).unwrap();
    symlink(dir.file_path(&a), scratch.0.join("runtime/a.service")).unwrap();
    symlink("/elsewhere/b.service", scratch.0.join("runtime/b.service")).unwrap();
    assert!(dir.is_linked(&a));
    assert!(!dir.is_linked(&name("b.service")));
    assert!(dir.list().unwrap()[0].linked);
}

#[test]
fn a_definition_from_the_units_directory_or_its_runtime_link_is_ours() {
    let scratch = Scratch::new("source-ours");
    let dir = scratch.open();
    let a = name("a.service");
    dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
        .unwrap();
    fs::create_dir_all(scratch.0.join("runtime")).unwrap();
    let link = scratch.0.join("runtime/a.service");
    symlink(dir.file_path(&a), &link).unwrap();
    assert_eq!(dir.source(&a, Some(link)), UnitSource::UnitsDir);
    assert_eq!(
        dir.source(&a, Some(dir.file_path(&a))),
        UnitSource::UnitsDir
    );
}

#[test]
fn an_existing_file_elsewhere_is_an_operators() {
    let scratch = Scratch::new("source-foreign");
    let dir = scratch.open();
    let a = name("a.service");
    let operator = scratch.0.join("etc-a.service");
    fs::write(&operator, "[Service]\nExecStart=/bin/true\n").unwrap();
    assert_eq!(
        dir.source(&a, Some(operator.clone())),
        UnitSource::Foreign { fragment: operator }
    );
}

#[test]
fn a_definition_whose_file_is_gone_or_absent_protects_nothing() {
    let scratch = Scratch::new("source-none");
    let dir = scratch.open();
    let a = name("a.service");
    assert_eq!(dir.source(&a, None), UnitSource::NoFile);
    let gone = scratch.0.join("gone.service");
    assert_eq!(dir.source(&a, Some(gone)), UnitSource::NoFile);
}

#[test]
fn removing_a_missing_file_is_fine() {
    let scratch = Scratch::new("remove");
    let dir = scratch.open();
    let a = name("a.service");
    dir.remove(&a).unwrap();
    dir.write(&a, &unit("[Service]\nExecStart=/bin/true\n"))
        .unwrap();
    dir.remove(&a).unwrap();
    assert!(dir.list().unwrap().is_empty());
}

#[test]
fn lists_nothing_when_the_directory_vanished() {
    let scratch = Scratch::new("vanished");
    let dir = scratch.open();
    fs::remove_dir(dir.path()).unwrap();
    assert!(dir.list().unwrap().is_empty());
}

/// A directory whose files count as settled 50 ms after their last change.
fn quick_settling(scratch: &Scratch) -> UnitsDir {
    let mut dir = scratch.open();
    dir.settle = Duration::from_millis(50);
    dir
}

fn settle() {
    std::thread::sleep(Duration::from_millis(80));
}

fn reads(dir: &UnitsDir) -> u64 {
    dir.reads.load(Ordering::Relaxed)
}

fn listed_hash(dir: &UnitsDir) -> UnitHash {
    *dir.list().unwrap()[0].content.as_ref().unwrap()
}

#[test]
fn reuses_the_hash_of_a_settled_unchanged_file_without_reading_it() {
    let scratch = Scratch::new("cache-hit");
    let dir = quick_settling(&scratch);
    let file = unit("[Service]\nExecStart=/bin/true\n");
    dir.write(&name("a.service"), &file).unwrap();
    settle();
    assert_eq!(listed_hash(&dir), file.hash());
    assert_eq!(reads(&dir), 1);
    assert_eq!(listed_hash(&dir), file.hash());
    assert_eq!(listed_hash(&dir), file.hash());
    assert_eq!(reads(&dir), 1, "read once");
}

#[test]
fn reads_a_file_again_until_it_has_settled() {
    let scratch = Scratch::new("cache-fresh");
    let dir = scratch.open();
    dir.write(
        &name("a.service"),
        &unit("[Service]\nExecStart=/bin/true\n"),
    )
    .unwrap();
    dir.list().unwrap();
    dir.list().unwrap();
    assert_eq!(
        reads(&dir),
        2,
        "changed less than a second ago: not trusted"
    );
}

#[test]
fn sees_a_file_rewritten_in_place_with_the_same_size() {
    let scratch = Scratch::new("cache-in-place");
    let dir = quick_settling(&scratch);
    let path = dir.file_path(&name("a.service"));
    fs::write(&path, "[Service]\nExecStart=/bin/aaa\n").unwrap();
    settle();
    listed_hash(&dir);
    let inode = fs::metadata(&path).unwrap().ino();
    // An operator's edit: same inode, same size, new content.
    fs::write(&path, "[Service]\nExecStart=/bin/bbb\n").unwrap();
    assert_eq!(fs::metadata(&path).unwrap().ino(), inode);
    assert_eq!(
        listed_hash(&dir),
        unit("[Service]\nExecStart=/bin/bbb\n").hash()
    );
}

#[test]
fn sees_a_file_whose_mtime_was_set_back() {
    let scratch = Scratch::new("cache-mtime");
    let dir = quick_settling(&scratch);
    let path = dir.file_path(&name("a.service"));
    fs::write(&path, "[Service]\nExecStart=/bin/aaa\n").unwrap();
    settle();
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    listed_hash(&dir);
    fs::write(&path, "[Service]\nExecStart=/bin/bbb\n").unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(
        listed_hash(&dir),
        unit("[Service]\nExecStart=/bin/bbb\n").hash()
    );
}

#[test]
fn sees_its_own_rewrite_and_forgets_removed_files() {
    let scratch = Scratch::new("cache-rewrite");
    let dir = quick_settling(&scratch);
    let a = name("a.service");
    dir.write(&a, &unit("[Service]\nExecStart=/bin/aaa\n"))
        .unwrap();
    settle();
    listed_hash(&dir);
    let new = unit("[Service]\nExecStart=/bin/bbb\n");
    dir.write(&a, &new).unwrap();
    assert_eq!(listed_hash(&dir), new.hash());
    settle();
    listed_hash(&dir);
    assert_eq!(dir.lock_hashes().len(), 1);
    dir.remove(&a).unwrap();
    assert!(dir.list().unwrap().is_empty());
    assert!(
        dir.lock_hashes().is_empty(),
        "nothing kept for a removed file"
    );
}

fn current_umask() -> u32 {
    let probe = std::env::temp_dir().join(format!("fleet-agent-umask-{}", std::process::id()));
    let _ = fs::remove_dir(&probe);
    fs::DirBuilder::new().mode(0o777).create(&probe).unwrap();
    let mode = fs::metadata(&probe).unwrap().permissions().mode();
    fs::remove_dir(&probe).unwrap();
    !mode & 0o777
}
