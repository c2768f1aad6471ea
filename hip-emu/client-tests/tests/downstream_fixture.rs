//! A crate outside this workspace (tests/fixtures/downstream-crate) with its own HIP kernel,
//! built with hip-build as a downstream user builds it, and its tests run on hip-emu: hip-emu
//! finds the kernel's host build by the code object's content, with no list of kernels in
//! hip-emu. Its own target directory (target/downstream-fixture: this test runs while Cargo
//! holds the workspace's), so the first run builds its dependencies once.
//!
//! Needs hipcc and a clang++ >= 15; without them it says why and checks nothing (it fails
//! instead with HIPK_REQUIRE_KERNELS=1, as CI sets).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

#[test]
fn a_downstream_crates_own_kernel_runs_on_hip_emu_with_every_check() {
    let root = common::repo_root();
    let fixture = root.join("tests/fixtures/downstream-crate");
    let required = std::env::var("HIPK_REQUIRE_KERNELS").is_ok_and(|v| v == "1");
    let missing = [
        (
            "hipcc",
            Command::new("hipcc").arg("--version").output().is_ok(),
        ),
        (
            "clang++ >= 15",
            hip_build::host::HostCompiler::find().is_ok(),
        ),
    ]
    .into_iter()
    .find(|(_, ok)| !ok);
    if let Some((tool, _)) = missing {
        assert!(!required, "HIPK_REQUIRE_KERNELS=1 but {tool} is missing");
        eprintln!("SKIPPED (nothing checked): {tool} is missing");
        return;
    }
    // The fixture resolves to the workspace's versions, so it builds offline.
    let lock = fixture.join("Cargo.lock");
    if !lock.exists() {
        std::fs::copy(root.join("Cargo.lock"), &lock).expect("copying Cargo.lock");
    }
    let lib = common::emu_library();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Twice: as built by default, then with the race check's instrumentation (hip-build's
    // caches make the second build cheap).
    for race in ["0", "1"] {
        let out = Command::new(&cargo)
            .args(["test", "--offline", "--manifest-path"])
            .arg(fixture.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", root.join("target/downstream-fixture"))
            .env("HIPK_HIP_LIBRARY", &lib)
            .env("HIPK_HIPBLAS_LIBRARY", &lib)
            .env("HIPK_ROCBLAS_LIBRARY", &lib)
            .env("HIPK_EMU_RACE_CHECK", race)
            // Kernel sources that hip-emu cannot compile must fail the fixture's build here.
            .env("HIPK_EMU_HOST_BUILD", "1")
            .env_remove("HIPK_EMU_KERNELS")
            .output()
            .expect("running cargo");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the fixture's tests failed (race check {race})\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        let passed: usize = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("test result: ok. "))
            .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
            .sum();
        assert!(passed >= 7, "only {passed} fixture tests ran\n{stdout}");
    }
}
