//! The Python stack section on fixture trees laid out as pip writes them (made by
//! `tools/doctor_fixtures/make.py`, committed): each case's rows, status and names.
//! The live import is tested with stand-in interpreters (shell scripts).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hip_doctor::python::envrows::{self, EnvInput};
use hip_doctor::python::resolve::Loader;
use hip_doctor::python::{interp, stack_rows, Context, Installed};
use hip_doctor::report::{Item, Status};

fn site(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/python")
        .join(case)
        .join("site-packages")
}

/// A scratch directory of this test process, removed by the caller's drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("hipdoc-py-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// Creates `dir/name` files (empty: the loader check looks for the file).
    fn files(&self, dir: &str, names: &[&str]) -> PathBuf {
        let d = self.0.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        for n in names {
            std::fs::write(d.join(n), b"").unwrap();
        }
        d
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A context: the archs needed, the installed DTK, a loader path and DTK's library directory
/// (not on the loader's path). The machine's own directories are left out.
fn ctx(
    targets: &[&str],
    dtk: Option<&str>,
    on_path: Vec<PathBuf>,
    runtime: Vec<PathBuf>,
) -> Context {
    Context {
        targets: targets.iter().map(|s| s.to_string()).collect(),
        targets_from: if targets.is_empty() {
            String::new()
        } else {
            format!("--arch {}", targets.join(","))
        },
        installed: Installed {
            dtk: dtk.map(str::to_owned),
            dtk_source: "/opt/dtk/.dtk_version: test".into(),
            looked: "/opt/dtk/.dtk_version".into(),
            ..Installed::default()
        },
        loader: Loader {
            ld_library_path: on_path,
            runtime_dirs: runtime,
            ..Loader::default()
        },
    }
}

fn row<'a>(rows: &'a [Item], name: &str) -> &'a Item {
    rows.iter().find(|r| r.name == name).unwrap_or_else(|| {
        let names: Vec<String> = rows
            .iter()
            .map(|r| format!("{} [{:?}]", r.name, r.status))
            .collect();
        panic!("no row {name:?}; rows: {names:#?}")
    })
}

fn assert_row(rows: &[Item], name: &str, status: Status, words: &[&str]) {
    let r = row(rows, name);
    assert_eq!(r.status, status, "{name}: {}", r.detail);
    let text = format!("{} {}", r.detail, r.hint.clone().unwrap_or_default());
    for w in words {
        assert!(text.contains(w), "{name}: {w:?} not in {text:?}");
    }
}

#[test]
fn dtk_build_that_fits() {
    let s = Scratch::new("fits");
    let rt = s.files("dtk/lib", &["libgalaxyhip.so.5", "libamdhip64.so.5"]);
    let rows = stack_rows(
        &ctx(&["gfx906"], Some("25.04"), vec![rt], vec![]),
        &[site("dtk_fits")],
        Some("3.11.2"),
    );
    assert_row(
        &rows,
        "torch build",
        Status::Pass,
        &["2.4.1+das.opt2.dtk2504", "DTK 25.04"],
    );
    assert_row(
        &rows,
        "torch vs installed DTK/ROCm",
        Status::Pass,
        &["DTK 25.04"],
    );
    assert_row(
        &rows,
        "torchvision → torch",
        Status::Pass,
        &["==2.4.1", "2.4.1+das.opt2.dtk2504"],
    );
    assert_row(
        &rows,
        "torch libtorch_hip.so",
        Status::Pass,
        &["gfx906", "1 offload bundle"],
    );
    assert!(
        rows.iter()
            .all(|r| !matches!(r.status, Status::Fail | Status::Warn)),
        "{rows:#?}"
    );
}

#[test]
fn cuda_wheel_on_a_dcu_fails_and_names_the_fix() {
    let rows = stack_rows(
        &ctx(&["gfx928"], Some("25.04"), vec![], vec![]),
        &[site("cuda_wheel")],
        Some("3.11.2"),
    );
    assert_row(
        &rows,
        "torch build",
        Status::Fail,
        &[
            "2.15.0+cu132",
            "CUDA 13.2",
            "--arch gfx928",
            "is_available() is False",
            "DTK 25.04's torch",
            "dtk2504",
        ],
    );
    // Without a DCU (no device, no --arch) it says what the build is.
    let rows = stack_rows(&ctx(&[], None, vec![], vec![]), &[site("cuda_wheel")], None);
    assert_row(
        &rows,
        "torch build",
        Status::Info,
        &["CUDA 13.2", "could not use the card"],
    );
}

#[test]
fn dtk_build_for_another_dtk() {
    let rows = stack_rows(
        &ctx(&["gfx906"], Some("26.04"), vec![], vec![]),
        &[site("dtk_other")],
        None,
    );
    assert_row(&rows, "torch build", Status::Pass, &["DTK 25.04"]);
    assert_row(
        &rows,
        "torch vs installed DTK/ROCm",
        Status::Fail,
        &[
            "built for DTK 25.04",
            "installed DTK is 26.04",
            "install DTK 26.04's torch",
        ],
    );
}

#[test]
fn torchvision_for_another_torch() {
    let rows = stack_rows(
        &ctx(&["gfx906"], Some("25.04"), vec![], vec![]),
        &[site("torchvision_other")],
        Some("3.11.2"),
    );
    assert_row(
        &rows,
        "torchvision → torch",
        Status::Fail,
        &[
            "torch ==2.4.1",
            "2.5.1+das.opt1.dtk2504 is installed",
            "crashes at import",
        ],
    );
    assert_row(
        &rows,
        "xformers build tag",
        Status::Fail,
        &["torch241", "2.5.1"],
    );
    assert_row(
        &rows,
        "xformers vs installed DTK",
        Status::Pass,
        &["DTK 25.04"],
    );
}

#[test]
fn flash_attn_for_gfx90a_only_on_gfx906() {
    let rows = stack_rows(
        &ctx(&["gfx906"], Some("25.04"), vec![], vec![]),
        &[site("flash_attn_gfx90a")],
        None,
    );
    assert_row(
        &rows,
        "flash_attn flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so",
        Status::Fail,
        &[
            "GPU code for gfx90a",
            "needs gfx906",
            "hipErrorNoBinaryForGpu",
            "HSA_OVERRIDE_GFX_VERSION",
        ],
    );
    // Two translation units, one with gfx906 and one without: the bundle lacking it is counted.
    assert_row(
        &rows,
        "flash_attn layers_ext.so",
        Status::Fail,
        &[
            "gfx906, gfx90a in 2 offload bundle(s)",
            "needs gfx906 (missing in 1 of 2 bundles)",
        ],
    );
    // The same library on a gfx90a node passes.
    let rows = stack_rows(
        &ctx(&["gfx90a"], None, vec![], vec![]),
        &[site("flash_attn_gfx90a")],
        None,
    );
    assert_row(
        &rows,
        "flash_attn flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so",
        Status::Pass,
        &["gfx90a"],
    );
    assert_row(
        &rows,
        "flash_attn layers_ext.so",
        Status::Pass,
        &["2 offload bundle(s)"],
    );
}

#[test]
fn bitsandbytes_without_a_rocm_library() {
    let rows = stack_rows(
        &ctx(&["gfx928"], None, vec![], vec![]),
        &[site("bnb_no_rocm")],
        None,
    );
    assert_row(
        &rows,
        "bitsandbytes backend",
        Status::Fail,
        &[
            "no ROCm/HIP library",
            "libbitsandbytes_cpu.so",
            "libbitsandbytes_cuda121.so",
        ],
    );
    let rows = stack_rows(
        &ctx(&[], None, vec![], vec![]),
        &[site("bnb_no_rocm")],
        None,
    );
    assert_row(
        &rows,
        "bitsandbytes backend",
        Status::Info,
        &["libbitsandbytes_cpu.so"],
    );
}

#[test]
fn libraries_needing_an_absent_hip() {
    let s = Scratch::new("missing");
    let dtk = s.files("dtk/lib", &["libgalaxyhip.so.5", "libamdhip64.so.5"]);
    let rows = stack_rows(
        &ctx(&["gfx928"], Some("25.04"), vec![], vec![dtk.clone()]),
        &[site("missing_hip")],
        None,
    );
    assert_row(
        &rows,
        "vllm _C.abi3.so needs libamdhip64.so.6",
        Status::Fail,
        &[
            "libamdhip64.so.6 is not found",
            "the installed runtime has libamdhip64.so.5",
            "install the build",
        ],
    );
    assert_row(
        &rows,
        "deepspeed fused_adam_op.so needs libgalaxyhip.so.5",
        Status::Fail,
        &[
            "only once DTK's environment is loaded",
            "source /opt/dtk/env.sh",
            &dtk.display().to_string(),
        ],
    );
    // With DTK's directory on LD_LIBRARY_PATH, libgalaxyhip.so.5 is found.
    let rows = stack_rows(
        &ctx(&["gfx928"], Some("25.04"), vec![dtk], vec![]),
        &[site("missing_hip")],
        None,
    );
    assert_row(
        &rows,
        "deepspeed fused_adam_op.so",
        Status::Pass,
        &["libgalaxyhip.so.5 →"],
    );
}

#[test]
fn compressed_bundles_zstd_and_zlib() {
    let rows = stack_rows(
        &ctx(&["gfx906"], None, vec![], vec![]),
        &[site("compressed")],
        None,
    );
    assert_row(
        &rows,
        "xformers _C.so",
        Status::Pass,
        &["gfx906, gfx90a", "1 compressed (zstd)"],
    );
    assert_row(
        &rows,
        "xformers _C_flashattention.so",
        Status::Pass,
        &["gfx906, gfx90a", "1 compressed (zlib)"],
    );
    let rows = stack_rows(
        &ctx(&["gfx928"], None, vec![], vec![]),
        &[site("compressed")],
        None,
    );
    assert_row(
        &rows,
        "xformers _C.so",
        Status::Fail,
        &["needs gfx928", "gfx906, gfx90a"],
    );
}

#[test]
fn truncated_and_garbage_libraries_are_rows() {
    let rows = stack_rows(
        &ctx(&["gfx906"], None, vec![], vec![]),
        &[site("truncated")],
        None,
    );
    assert_row(
        &rows,
        "apex fused_dense_cuda.so",
        Status::Fail,
        &["fused_dense_cuda.so", "truncated", "reinstall apex"],
    );
    assert_row(
        &rows,
        "apex amp_C.so",
        Status::Fail,
        &["amp_C.so", "not a readable 64-bit ELF"],
    );
}

#[test]
fn the_override_variable_warns_and_explains() {
    let input = EnvInput {
        vars: vec![("HSA_OVERRIDE_GFX_VERSION".into(), "9.0.6".into())],
        ..EnvInput::default()
    };
    let rows = envrows::rows(&input);
    assert_row(
        &rows,
        "HSA_OVERRIDE_GFX_VERSION",
        Status::Warn,
        &[
            "=9.0.6",
            "gfx906",
            "hides hipErrorNoBinaryForGpu",
            "unset it",
        ],
    );
}

#[test]
fn dtk_variables_only_in_profile_d_warn() {
    let input = EnvInput {
        profile_scripts: vec![(
            "/etc/profile.d/dtk.sh".into(),
            "# DTK\nsource /opt/dtk/env.sh\n".into(),
        )],
        ..EnvInput::default()
    };
    assert_row(
        &envrows::rows(&input),
        "DTK environment",
        Status::Warn,
        &["/etc/profile.d/dtk.sh", "batch jobs"],
    );
    let set = EnvInput {
        vars: vec![("ROCM_PATH".into(), "/opt/dtk".into())],
        ..input
    };
    assert!(envrows::rows(&set)
        .iter()
        .all(|r| r.name != "DTK environment"));
}

#[test]
fn miopen_locations_writable_local_or_not() {
    let s = Scratch::new("miopen");
    let home = s.files("home", &[]);
    let base = |uid, mounts: String| EnvInput {
        vars: vec![("HOME".into(), home.display().to_string())],
        uid: Some(uid),
        mounts,
        miopen_used: true,
        ..EnvInput::default()
    };
    let me = std::fs::metadata(&home)
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap();
    // Owner with a local filesystem: writable (the directories do not exist yet).
    let rows = envrows::rows(&base(me, "/dev/sda1 / ext4 rw 0 0\n".into()));
    assert_row(
        &rows,
        "MIOpen user database",
        Status::Pass,
        &[".config/miopen", "would be created in"],
    );
    assert_row(
        &rows,
        "MIOpen kernel cache",
        Status::Pass,
        &[".cache/miopen"],
    );
    // Another user (not root) may not write the owner's 0755 home.
    std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let other = if me == 0 { 4242 } else { me + 1 };
    let rows = envrows::rows(&base(other, String::new()));
    assert_row(
        &rows,
        "MIOpen kernel cache",
        Status::Fail,
        &["not writable", "MIOPEN_CUSTOM_CACHE_DIR"],
    );
    assert_row(
        &rows,
        "MIOpen user database",
        Status::Fail,
        &["not writable", "MIOPEN_USER_DB_PATH"],
    );
    // Where MIOpen is not used (no AMD/Hygon GPU, no ROCm/DTK torch) the same problem is INFO.
    let unused = EnvInput {
        miopen_used: false,
        ..base(other, String::new())
    };
    assert_row(
        &envrows::rows(&unused),
        "MIOpen kernel cache",
        Status::Info,
        &["not writable", "not needed here"],
    );
    // On NFS: a warning.
    let nfs = format!("server:/export {} nfs4 rw,relatime 0 0\n", home.display());
    let rows = envrows::rows(&base(me, nfs));
    assert_row(
        &rows,
        "MIOpen kernel cache",
        Status::Warn,
        &["network filesystem", "nfs4"],
    );
    // A read-only mount fails even for the owner.
    let ro = format!("/dev/sdb {} ext4 ro 0 0\n", home.display());
    assert_row(
        &envrows::rows(&base(me, ro)),
        "MIOpen user database",
        Status::Fail,
        &["read-only"],
    );
}

/// A stand-in interpreter: a shell script.
fn script(s: &Scratch, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = s.0.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn live_import_reports_a_crash_by_its_signal() {
    let s = Scratch::new("segv");
    let python = script(&s, "python", "echo importing; kill -SEGV $$");
    let item = interp::live_import(&python, Duration::from_secs(20), true);
    assert_eq!(item.status, Status::Fail, "{}", item.detail);
    assert!(item.detail.contains("SIGSEGV (11)"), "{}", item.detail);
    assert!(item.hint.unwrap_or_default().contains("torchvision"));
}

#[test]
fn live_import_kills_a_hang_at_its_time_limit() {
    let s = Scratch::new("hang");
    // The child sleeps in a grandchild too: the whole group must go.
    let python = script(&s, "python", "sleep 300 & sleep 300");
    let start = Instant::now();
    let item = interp::live_import(&python, Duration::from_secs(2), true);
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(item.status, Status::Fail);
    assert!(
        item.detail.contains("no answer within 2 s"),
        "{}",
        item.detail
    );
}

#[test]
fn live_import_bounds_what_it_keeps() {
    let s = Scratch::new("flood");
    let python = script(
        &s,
        "python",
        "head -c 10000000 /dev/zero | tr '\\0' x; echo",
    );
    let run = interp::run_bounded(&python, &[], Duration::from_secs(30));
    assert_eq!(run.ending, interp::Ending::Exited(0));
    assert_eq!(run.stdout.len(), interp::OUTPUT_LIMIT);
    assert_eq!(run.dropped, 10_000_001 - interp::OUTPUT_LIMIT as u64);
    let item = interp::live_import(&python, Duration::from_secs(30), true);
    assert_eq!(item.status, Status::Fail);
    assert!(
        item.detail.contains("did not print the expected lines") && item.detail.contains("dropped"),
        "{}",
        item.detail
    );
    // The query step refuses it too.
    let err = interp::query(&python, Duration::from_secs(30)).unwrap_err();
    assert!(err.contains("dropped"), "{err}");
}

#[test]
fn live_import_reads_a_good_answer() {
    let s = Scratch::new("good");
    let answer = "version 2.4.1+das.opt2.dtk2504\nhip 6.3.25024\ncuda None\navailable True\ndevices 8\nmatmul 64.0";
    let python = script(
        &s,
        "python",
        &format!("printf '{}\\n'", answer.replace('\n', "\\n")),
    );
    let item = interp::live_import(&python, Duration::from_secs(20), true);
    assert_eq!(item.status, Status::Pass, "{}", item.detail);
    assert!(
        item.detail.contains("device_count() 8") && item.detail.contains("= 64"),
        "{}",
        item.detail
    );
    let cpu = script(
        &s,
        "python2",
        "printf 'version 2.15.0+cu132\\nhip None\\ncuda 13.2\\navailable False\\ndevices 0\\n'",
    );
    let item = interp::live_import(&cpu, Duration::from_secs(20), true);
    assert_eq!(item.status, Status::Fail, "{}", item.detail);
    assert!(item.detail.contains("sees no GPU"), "{}", item.detail);
}

#[test]
fn interpreter_query_reads_version_and_sys_path() {
    let s = Scratch::new("query");
    let python = script(
        &s,
        "python",
        "printf '3.11.2\\000/usr/lib/python311.zip\\000/x/site-packages'",
    );
    let facts = interp::query(&python, Duration::from_secs(20)).unwrap();
    assert_eq!(facts.version, "3.11.2");
    assert_eq!(
        facts.sys_path,
        vec![
            PathBuf::from("/usr/lib/python311.zip"),
            PathBuf::from("/x/site-packages")
        ]
    );
    let bad = script(&s, "bad", "echo not python; exit 3");
    let err = interp::query(&bad, Duration::from_secs(20)).unwrap_err();
    assert!(err.contains("status 3"), "{err}");
}

#[test]
fn the_section_follows_the_interpreter_to_its_site_packages() {
    use hip_doctor::python::{section, PythonArgs};
    let s = Scratch::new("section");
    // A stand-in interpreter whose sys.path holds the CUDA-wheel fixture.
    let answer = format!(
        "3.11.2\\000/usr/lib/python311.zip\\000{}",
        site("cuda_wheel").display()
    );
    let python = script(&s, "python", &format!("printf '{answer}'"));
    let args = PythonArgs {
        python: Some(python.clone()),
        arch: vec!["gfx928".into()],
        ..PythonArgs::default()
    };
    let input = EnvInput::default();
    let rows = section(
        &args,
        &ctx(&["gfx928"], Some("25.04"), vec![], vec![]),
        &input,
    )
    .items;
    assert_row(
        &rows,
        "Python interpreter",
        Status::Info,
        &["from --python", "Python 3.11.2", "cuda_wheel"],
    );
    assert_row(&rows, "torch build", Status::Fail, &["CUDA 13.2"]);
    // MIOpen is used on an AMD node: with HOME unset its rows fail.
    assert_row(
        &rows,
        "MIOpen kernel cache",
        Status::Fail,
        &["HOME are both unset"],
    );
    let diagnosis = hip_doctor::python::diagnosis(&hip_doctor::report::Section {
        title: "Python stack".into(),
        items: rows,
    });
    assert_eq!(diagnosis.len(), 1);
    assert!(
        diagnosis[0].detail.contains("torch build")
            && diagnosis[0]
                .hint
                .as_deref()
                .unwrap_or("")
                .contains("DTK 25.04's torch")
    );

    // An interpreter named with --python that does not exist is a FAIL; --python-import is then
    // skipped. Only --site-packages: no interpreter row at all.
    let args = PythonArgs {
        python: Some(s.0.join("no-such-python")),
        python_import: true,
        ..PythonArgs::default()
    };
    let rows = section(&args, &ctx(&[], None, vec![], vec![]), &input).items;
    assert_row(
        &rows,
        "Python interpreter",
        Status::Fail,
        &["no-such-python", "could not be started"],
    );
    assert_row(
        &rows,
        "import torch (live)",
        Status::Skipped,
        &["no interpreter answered"],
    );
    let args = PythonArgs {
        site_packages: vec![site("dtk_fits")],
        ..PythonArgs::default()
    };
    let rows = section(&args, &ctx(&[], None, vec![], vec![]), &input).items;
    assert!(rows.iter().all(|r| r.name != "Python interpreter"));
    assert_row(&rows, "torch build", Status::Pass, &["DTK 25.04"]);
}
