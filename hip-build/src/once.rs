//! Warnings said once per `cargo` invocation rather than once per crate: several crates of one
//! build (a library, its tests' kernels, a downstream crate) each run hip-build, and the same
//! "dropped archs" warning from each of them is noise. The first build script of an invocation
//! that says a given warning leaves a marker named after the invocation (the parent `cargo`
//! process: its pid and start time, so a later build with a reused pid still warns) and the
//! message; the others see the marker and stay quiet.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::Path;

/// The running cargo invocation: the parent's pid and its start time (field 22 of
/// `/proc/<pid>/stat`), or `None` where that cannot be read (then every crate warns).
fn invocation() -> Option<String> {
    let ppid = std::os::unix::process::parent_id();
    let stat = fs::read_to_string(format!("/proc/{ppid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces: skip past it.
    let after = stat.rsplit_once(')')?.1;
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{ppid}-{start}"))
}

/// True the first time `message` is offered in this cargo invocation (per cache directory).
pub(crate) fn first_in_invocation(cache_root: &Path, message: &str) -> bool {
    let Some(inv) = invocation() else { return true };
    let mut h = DefaultHasher::new();
    message.hash(&mut h);
    let dir = cache_root.join("warned");
    if fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let marker = dir.join(format!("{inv}-{:016x}", h.finish()));
    // create_new is atomic: of several build scripts running at once, exactly one wins.
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(marker)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_first_once_per_invocation_and_cache() {
        let dir = tempfile::tempdir().unwrap();
        assert!(first_in_invocation(dir.path(), "dropped gfx926"));
        assert!(!first_in_invocation(dir.path(), "dropped gfx926"));
        assert!(first_in_invocation(dir.path(), "dropped gfx928"));
        let other = tempfile::tempdir().unwrap();
        assert!(first_in_invocation(other.path(), "dropped gfx926"));
    }

    #[test]
    fn the_invocation_names_the_parent_and_its_start() {
        let inv = invocation().expect("/proc is readable here");
        let (pid, start) = inv.split_once('-').unwrap();
        assert_eq!(
            pid.parse::<u32>().unwrap(),
            std::os::unix::process::parent_id()
        );
        assert!(start.parse::<u64>().is_ok(), "{inv}");
    }
}
