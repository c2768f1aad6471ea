use super::*;
use std::collections::HashMap;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn file(p: &str) -> Target {
    Target::File(PathBuf::from(p))
}

/// The directories searched, in order, for a given environment.
fn dirs_of(targets: &[Target]) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    for t in targets {
        if let Target::File(p) = t {
            let d = p.parent().unwrap().display().to_string();
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    dirs
}

#[test]
fn default_order_without_variables() {
    let t = targets(&HIP_RUNTIME, &env_of(&[]));
    assert_eq!(
        dirs_of(&t),
        ["/opt/dtk/hip/lib", "/opt/dtk/lib", "/opt/rocm/lib"]
    );
    // Each directory tries every name in order, then the system loader does.
    assert_eq!(t[0], file("/opt/dtk/hip/lib/libamdhip64.so"));
    assert_eq!(t[1], file("/opt/dtk/hip/lib/libamdhip64.so.7"));
    assert_eq!(t[4], file("/opt/dtk/hip/lib/libgalaxyhip.so.5"));
    assert_eq!(t.len(), 3 * 5 + 5);
    let system: Vec<&Target> = t[15..].iter().collect();
    assert_eq!(
        system,
        [
            &Target::SystemLoader("libamdhip64.so"),
            &Target::SystemLoader("libamdhip64.so.7"),
            &Target::SystemLoader("libamdhip64.so.6"),
            &Target::SystemLoader("libamdhip64.so.5"),
            &Target::SystemLoader("libgalaxyhip.so.5"),
        ]
    );
}

#[test]
fn variables_come_first_in_issue_order() {
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Env, &[&str])] = &[
        (
            &[("HIP_PATH", "/h"), ("ROCM_PATH", "/r")],
            &[
                "/h/lib",
                "/r/lib",
                "/r/hip/lib",
                "/opt/dtk/hip/lib",
                "/opt/dtk/lib",
                "/opt/rocm/lib",
            ],
        ),
        (
            &[("ROCM_PATH", "/opt/rocm-6.3.0")],
            &[
                "/opt/rocm-6.3.0/lib",
                "/opt/rocm-6.3.0/hip/lib",
                "/opt/dtk/hip/lib",
                "/opt/dtk/lib",
                "/opt/rocm/lib",
            ],
        ),
        // DTK's env.sh: duplicates of the fixed directories are tried once, in first position.
        (
            &[("ROCM_PATH", "/opt/dtk"), ("HIP_PATH", "/opt/dtk/hip")],
            &["/opt/dtk/hip/lib", "/opt/dtk/lib", "/opt/rocm/lib"],
        ),
        // Empty variables are ignored.
        (
            &[("HIP_PATH", ""), ("ROCM_PATH", "")],
            &["/opt/dtk/hip/lib", "/opt/dtk/lib", "/opt/rocm/lib"],
        ),
    ];
    for (env, want) in cases {
        let t = targets(&HIP_RUNTIME, &env_of(env));
        assert_eq!(dirs_of(&t), *want, "env {env:?}");
    }
}

#[test]
fn override_is_the_only_target() {
    let t = targets(
        &HIP_RUNTIME,
        &env_of(&[
            ("HIPK_HIP_LIBRARY", "/x/libamdhip64.so"),
            ("ROCM_PATH", "/r"),
        ]),
    );
    assert_eq!(t, [file("/x/libamdhip64.so")]);
    let t = targets(&HIP_RUNTIME, &env_of(&[("HIPK_HIP_LIBRARY", "")]));
    assert!(t.len() > 1, "an empty override is ignored");
}

#[test]
fn search_skips_absent_files_and_stops_at_the_first_open() {
    let present = [
        "/opt/rocm/lib/libamdhip64.so.6",
        "/opt/rocm/lib/libamdhip64.so.5",
    ];
    let is_file = |p: &Path| present.iter().any(|f| Path::new(f) == p);
    let mut opened = Vec::new();
    let mut open = |t: &Target| -> Result<u32, String> {
        opened.push(t.clone());
        Ok(7)
    };
    let (found, report) = search(&HIP_RUNTIME, &env_of(&[]), &is_file, &mut open);
    assert_eq!(found, Some((file("/opt/rocm/lib/libamdhip64.so.6"), 7)));
    assert_eq!(opened, [file("/opt/rocm/lib/libamdhip64.so.6")]);
    assert_eq!(
        report.opened(),
        Some(&file("/opt/rocm/lib/libamdhip64.so.6"))
    );
    let last = report.attempts.last().unwrap();
    assert_eq!(last.outcome, Outcome::Opened);
    assert!(report.attempts[..report.attempts.len() - 1]
        .iter()
        .all(|a| a.outcome == Outcome::Absent));
}

#[test]
fn open_failures_are_recorded_and_the_search_goes_on() {
    let is_file = |p: &Path| p == Path::new("/opt/dtk/lib/libgalaxyhip.so.5");
    let mut open = |t: &Target| -> Result<(), String> {
        match t {
            Target::File(_) => Err("libhsa-runtime64.so.1: cannot open shared object file".into()),
            Target::SystemLoader(name) if *name == "libamdhip64.so.5" => Ok(()),
            Target::SystemLoader(name) => Err(format!("{name}: cannot open shared object file")),
        }
    };
    let (found, report) = search(&HIP_RUNTIME, &env_of(&[]), &is_file, &mut open);
    assert_eq!(
        found.map(|f| f.0),
        Some(Target::SystemLoader("libamdhip64.so.5"))
    );
    let failed: Vec<&Attempt> = report
        .attempts
        .iter()
        .filter(|a| matches!(a.outcome, Outcome::OpenFailed(_)))
        .collect();
    assert_eq!(
        failed.len(),
        1 + 3,
        "the DTK file and three system names before .so.5"
    );
    let text = report.to_string();
    assert!(text.contains("libhsa-runtime64.so.1"), "{text}");
}

#[test]
fn not_found_report_lists_every_place_and_the_fix() {
    let mut open =
        |_: &Target| -> Result<(), String> { Err("cannot open shared object file".into()) };
    let env = env_of(&[("ROCM_PATH", "/r")]);
    let (found, report) = search(&HIP_RUNTIME, &env, &|_| false, &mut open);
    assert!(found.is_none());
    let text = report.to_string();
    for needle in [
        "HIP runtime library not found",
        "/r/lib/{libamdhip64.so, libamdhip64.so.7, libamdhip64.so.6, libamdhip64.so.5, libgalaxyhip.so.5}: not present",
        "/r/hip/lib/{",
        "/opt/dtk/hip/lib/{",
        "/opt/dtk/lib/{",
        "/opt/rocm/lib/{",
        "libgalaxyhip.so.5 (system loader): cannot open shared object file",
        "HIPK_HIP_LIBRARY unset",
        "ROCM_PATH=/r",
        "HIP_PATH unset",
        "LD_LIBRARY_PATH",
        "source /opt/dtk/env.sh",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn missing_override_file_is_named() {
    let env = env_of(&[("HIPK_HIP_LIBRARY", "/nope/libamdhip64.so")]);
    let mut open = |_: &Target| -> Result<(), String> { panic!("absent files are not opened") };
    let (found, report) = search(&HIP_RUNTIME, &env, &|_| false, &mut open);
    assert!(found.is_none());
    let text = report.to_string();
    assert!(
        text.contains("HIPK_HIP_LIBRARY=/nope/libamdhip64.so: no such file"),
        "{text}"
    );
}

#[test]
fn a_bare_override_name_is_neither_probed_nor_opened() {
    let is_file = |p: &Path| -> bool { panic!("{} probed", p.display()) };
    let mut open = |t: &Target| -> Result<(), String> { panic!("{t} opened") };
    let env = env_of(&[("HIPK_HIP_LIBRARY", "libamdhip64.so")]);
    let (found, report) = search(&HIP_RUNTIME, &env, &is_file, &mut open);
    assert!(found.is_none());
    assert_eq!(report.attempts.len(), 1);
    assert_eq!(
        report.attempts[0].outcome,
        Outcome::NotAFile(BARE_NAME.into())
    );
    let text = report.to_string();
    assert!(
        text.contains("HIPK_HIP_LIBRARY=libamdhip64.so: is a bare file name"),
        "{text}"
    );
    assert!(is_bare_name(Path::new("libamdhip64.so")));
    assert!(!is_bare_name(Path::new("./libamdhip64.so")));
    assert!(!is_bare_name(Path::new("/opt/rocm/lib/libamdhip64.so")));
}

/// DTK 26.04's env.sh sets `ROCM_PATH=/opt/dtk/.hyhal` (the driver userspace), where no HIP
/// runtime lives: DTK's own library folders must still be searched after it.
#[test]
fn dtk_2604_rocm_path_keeps_dtks_library_folders() {
    let t = targets(&HIP_RUNTIME, &env_of(&[("ROCM_PATH", "/opt/dtk/.hyhal")]));
    assert_eq!(
        dirs_of(&t),
        [
            "/opt/dtk/.hyhal/lib",
            "/opt/dtk/.hyhal/hip/lib",
            "/opt/dtk/hip/lib",
            "/opt/dtk/lib",
            "/opt/rocm/lib"
        ]
    );
}
