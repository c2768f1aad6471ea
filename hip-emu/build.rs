//! Host build of the kernels for hip-emu.
//!
//! Compiles the repository's `kernels/*.hip`, hip-rt's test kernels `hip-rt/kernels/*.hip`
//! (`hipk_test_*`, which hip-rt's tests and examples build with hipcc), and the test-only
//! `hip-emu/tests/kernels/*.hip` (`hipemu_test_*`) as host C++ with clang++ >= 15 against the shim in
//! `shim/`, and generates the kernel registry: every `extern "C" __global__` function found in
//! the preprocessed source gets a trampoline and its parameter sizes, deduced from its C++
//! signature (shim/hipemu_registry.h). No list of kernel names is kept by hand.
//!
//! Compiler: `HIPK_EMU_CXX` if set, else the first clang++ >= 15 found (clang++, clang++-15..20,
//! /usr/lib/llvm-*/bin/clang++). Without one the build still succeeds: it prints a
//! `cargo:warning`, the registry is empty and `exec::host_build_available()` returns the reason.
//! `HIPK_EMU_RACE_CHECK=1` at build time also instruments the repository's kernels for the race
//! check (the test kernels are always instrumented).

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("hip-emu lives in the workspace root")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rustc-env=HIPEMU_SOURCE_ROOT={}/", root.display());
    println!("cargo::rustc-check-cfg=cfg(hipemu_kernels)");
    println!("cargo::rustc-check-cfg=cfg(hipemu_race_kernels)");
    for var in ["HIPK_EMU_CXX", "HIPK_EMU_RACE_CHECK", "HIPK_EMU_NO_FMA"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-changed=build.rs");
    let kernel_dir = root.join("kernels");
    let test_dir = manifest.join("tests").join("kernels");
    let rt_dir = root.join("hip-rt").join("kernels");
    println!("cargo:rerun-if-changed={}", kernel_dir.display());
    println!("cargo:rerun-if-changed={}", rt_dir.display());
    println!("cargo:rerun-if-changed={}", test_dir.display());

    match build(&root, &manifest, &out, [&kernel_dir, &rt_dir], &test_dir) {
        Ok(count) => {
            println!("cargo:rustc-cfg=hipemu_kernels");
            println!("cargo:rustc-env=HIPEMU_NO_HOST_BUILD_REASON=");
            let _ = count;
        }
        Err(reason) => {
            println!(
                "cargo:warning=hip-emu: kernels not built for the host ({reason}); the device \
                 suite cannot run on hip-emu (set HIPK_EMU_CXX to a clang++ >= 15)"
            );
            let reason = reason.replace(['\n', '\r'], " ");
            println!("cargo:rustc-env=HIPEMU_NO_HOST_BUILD_REASON={reason}");
        }
    }
}

/// Test kernels are always built with the race-check instrumentation.
const TEST_KERNELS_RACE: bool = true;

/// A kernel source and how to compile it.
struct Source {
    path: PathBuf,
    /// Compile with -fsanitize=thread instrumentation (race check).
    race: bool,
}

fn build(
    root: &Path,
    manifest: &Path,
    out: &Path,
    [kernel_dir, rt_dir]: [&Path; 2],
    test_dir: &Path,
) -> Result<usize, String> {
    let cxx = find_cxx()?;
    let shim = manifest.join("shim");
    let race_all = env::var("HIPK_EMU_RACE_CHECK").is_ok_and(|v| v == "1");
    if race_all {
        println!("cargo:rustc-cfg=hipemu_race_kernels");
    }
    let mut sources = Vec::new();
    for (dir, race) in [
        (kernel_dir, race_all),
        (rt_dir, race_all),
        (test_dir, TEST_KERNELS_RACE),
    ] {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "hip"))
            .collect();
        files.sort();
        for path in files {
            println!("cargo:rerun-if-changed={}", path.display());
            sources.push(Source { path, race });
        }
    }
    for header in ["common.h", "tile_io.h", "attention.h", "gelu.h"] {
        println!(
            "cargo:rerun-if-changed={}",
            kernel_dir.join(header).display()
        );
    }

    let gen = out.join("hipemu_gen");
    fs::create_dir_all(&gen).map_err(|e| format!("cannot create {}: {e}", gen.display()))?;
    // __FILE__ / __builtin_FILE relative to the repository (messages name kernels/x.hip:line);
    // the DWARF keeps absolute paths (the race check strips the root when it reports).
    let prefix_map = format!("-fmacro-prefix-map={}/=", root.display());
    let mut names_all = Vec::new();
    let mut plain = Vec::new();
    let mut race = Vec::new();
    for (i, src) in sources.iter().enumerate() {
        let text = fs::read_to_string(&src.path)
            .map_err(|e| format!("cannot read {}: {e}", src.path.display()))?;
        let rel = src
            .path
            .strip_prefix(root)
            .unwrap_or(&src.path)
            .display()
            .to_string();
        // `extern __shared__ T name[];` cannot be a macro: rewrite it (same line count, #line
        // keeps the kernel's own file name and line numbers in every message).
        let include = if text.contains("extern __shared__") {
            let copy = gen.join(format!("src{i}.hip"));
            let rewritten = format!(
                "#line 1 \"{}\"\n{}",
                src.path.display(),
                rewrite_extern_shared(&text)
            );
            write_if_changed(&copy, &rewritten)?;
            copy
        } else {
            src.path.clone()
        };
        let names = kernel_names(&cxx, &shim, &include, &src.path)?;
        let mut tu = String::new();
        let _ = writeln!(
            tu,
            "// Generated by hip-emu/build.rs from {rel}: do not edit."
        );
        // This file's static __shared__ variables live in their own section (its bounds are
        // the linker's __start_/__stop_ symbols, weak: a file without __shared__ has none).
        let _ = writeln!(tu, "#define HIPEMU_LDS_SECTION \"hipemu_lds_{i}\"");
        let _ = writeln!(tu, "#include \"{}\"", include.display());
        for (edge, macro_name) in [("start", "HIPEMU_LDS_BEGIN"), ("stop", "HIPEMU_LDS_END")] {
            let _ = writeln!(
                tu,
                "extern \"C\" char __{edge}_hipemu_lds_{i}[] \
                 __attribute__((weak, visibility(\"hidden\")));\n#define {macro_name} __{edge}_hipemu_lds_{i}"
            );
        }
        let _ = writeln!(tu, "#include \"hipemu_registry.h\"");
        for n in &names {
            let _ = writeln!(tu, "HIPEMU_ENTRY({n})");
        }
        let tu_path = gen.join(format!("kernels{i}.cpp"));
        write_if_changed(&tu_path, &tu)?;
        if src.race {
            race.push(tu_path)
        } else {
            plain.push(tu_path)
        }
        names_all.extend(names);
    }
    let mut seen = std::collections::BTreeSet::new();
    for n in &names_all {
        if !seen.insert(n) {
            return Err(format!("kernel {n} is defined in two files"));
        }
    }

    let mut reg = String::from(
        "// Generated by hip-emu/build.rs: the kernel registry.\n#include \"hipemu_registry.h\"\n",
    );
    for n in &names_all {
        let _ = writeln!(reg, "extern \"C\" const hipemu_entry hipemu_entry_{n};");
    }
    let _ = writeln!(
        reg,
        "extern \"C\" const hipemu_entry* const hipemu_registry[] = {{"
    );
    for n in &names_all {
        let _ = writeln!(reg, "  &hipemu_entry_{n},");
    }
    let _ = writeln!(
        reg,
        "  nullptr}};\nextern \"C\" const size_t hipemu_registry_len = {};",
        names_all.len()
    );
    let reg_path = gen.join("registry.cpp");
    write_if_changed(&reg_path, &reg)?;

    let base = |race: bool| {
        let mut b = cc::Build::new();
        b.cpp(true)
            .compiler(&cxx)
            .cargo_warnings(false)
            .opt_level(2)
            .debug(false)
            .include(&shim)
            .include(kernel_dir)
            .flag("-std=c++17")
            // Line tables in every profile: the race check reports kernel source lines. Release
            // links keep them only because hip-emu's release profile has line tables too
            // (workspace Cargo.toml); Cargo strips all debug info otherwise.
            .flag("-g1")
            .flag("-fno-exceptions")
            .flag("-fno-rtti")
            .flag("-fno-strict-aliasing")
            // Frames over a page probe every page, so a fibre's stack overflow always lands
            // on its guard page (never silently in the memory below it).
            .flag("-fstack-clash-protection")
            .flag("-Wno-pass-failed")
            .flag("-Wno-unknown-pragmas")
            .flag(&prefix_map);
        if fma_ok() {
            b.flag("-mfma");
        }
        if race {
            b.flag("-fsanitize=thread").define("HIPEMU_RACE_CHECK", "1");
        }
        b
    };
    let mut b = base(false);
    b.file(shim.join("hipemu_state.cpp"))
        .file(shim.join("hipemu_race.cpp"))
        .file(&reg_path);
    for f in &plain {
        b.file(f);
    }
    b.try_compile("hipemu_kernels")
        .map_err(|e| format!("compiling the kernels for the host failed: {e}"))?;
    if !race.is_empty() {
        let mut r = base(true);
        for f in &race {
            r.file(f);
        }
        r.try_compile("hipemu_kernels_race")
            .map_err(|e| format!("compiling the race-checked kernels for the host failed: {e}"))?;
    }
    Ok(names_all.len())
}

/// FMA instructions for the kernels' fmaf when the build machine has them and builds for itself
/// (else fmaf is a correctly rounded libm call: same results, slower). HIPK_EMU_NO_FMA=1 turns
/// it off.
fn fma_ok() -> bool {
    if env::var("HIPK_EMU_NO_FMA").is_ok_and(|v| v == "1")
        || env::var("HOST").ok() != env::var("TARGET").ok()
    {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), String> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The first usable clang++ (>= 15).
fn find_cxx() -> Result<PathBuf, String> {
    if let Ok(cxx) = env::var("HIPK_EMU_CXX") {
        let p = PathBuf::from(&cxx);
        return match clang_major(&p) {
            Some(v) if v >= 15 => Ok(p),
            Some(v) => Err(format!("HIPK_EMU_CXX={cxx} is clang {v}, need >= 15")),
            None => Err(format!("HIPK_EMU_CXX={cxx} is not a runnable clang++")),
        };
    }
    let mut candidates: Vec<PathBuf> = vec![PathBuf::from("clang++")];
    for v in (15..=20).rev() {
        candidates.push(PathBuf::from(format!("clang++-{v}")));
        candidates.push(PathBuf::from(format!("/usr/lib/llvm-{v}/bin/clang++")));
    }
    candidates
        .into_iter()
        .find(|c| clang_major(c).is_some_and(|v| v >= 15))
        .ok_or_else(|| "no clang++ >= 15 found".to_string())
}

fn clang_major(cxx: &Path) -> Option<u32> {
    let out = Command::new(cxx).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("clang version ")? + "clang version ".len()..];
    rest.split('.').next()?.trim().parse().ok()
}

/// Names of the `extern "C" __global__` functions of a kernel source, from its preprocessed
/// text (the shim defines __global__ as an annotate attribute that survives preprocessing).
fn kernel_names(cxx: &Path, shim: &Path, file: &Path, shown: &Path) -> Result<Vec<String>, String> {
    let out = Command::new(cxx)
        .args(["-x", "c++", "-std=c++17", "-E", "-P"])
        .arg("-I")
        .arg(shim)
        .arg("-I")
        .arg(shown.parent().unwrap_or(Path::new(".")))
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cxx.display()))?;
    if !out.status.success() {
        return Err(format!(
            "preprocessing {} failed: {}",
            shown.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    const MARK: &str = "extern \"C\" __attribute__((annotate(\"hipemu_kernel\")))";
    let mut names = Vec::new();
    let mut rest: &str = &text;
    while let Some(at) = rest.find(MARK) {
        rest = &rest[at + MARK.len()..];
        let after = rest.trim_start();
        let Some(after) = after.strip_prefix("void") else {
            continue;
        };
        let after = after.trim_start();
        let name: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            names.push(name);
        }
    }
    Ok(names)
}

/// `extern __shared__ <type> <name>[];` -> `HIPEMU_EXTERN_SHARED(<type>, <name>);` on the same
/// line (the dynamic LDS buffer of the launch).
fn rewrite_extern_shared(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("extern __shared__") {
        out.push_str(&rest[..at]);
        let decl_start = at + "extern __shared__".len();
        let Some(semi) = rest[decl_start..].find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let decl = rest[decl_start..decl_start + semi].trim();
        let head = decl.split('[').next().unwrap_or(decl).trim();
        let split = head
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = head.split_at(split);
        let ty = strip_align(ty);
        let _ = write!(out, "HIPEMU_EXTERN_SHARED({}, {});", ty.trim(), name.trim());
        rest = &rest[decl_start + semi + 1..];
    }
    out.push_str(rest);
    out
}

/// `__align__(16) float` -> `float` (the dynamic LDS buffer is 16-byte aligned anyway).
fn strip_align(ty: &str) -> String {
    let mut out = ty.to_string();
    while let Some(at) = out.find("__align__(") {
        let end = out[at..].find(')').map_or(out.len(), |e| at + e + 1);
        out.replace_range(at..end, "");
    }
    out
}
