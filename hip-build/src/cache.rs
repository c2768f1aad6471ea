//! The content cache of kernel compiles, shared by every build script run of a Cargo target
//! directory: a profile change, a new `OUT_DIR` (other features) or `cargo clean -p` of the
//! crate does not rerun hipcc when the inputs are the same.
//!
//! Key of a source: the FNV-1a hash of its text, of every file in the kernels directory and the
//! include directories (names and contents: any header may be included), of the flags, the
//! archs and the compiler (path and `--version`). An entry holds the bundle, the resource
//! records and the compiler's warnings. Location: `HIPK_BUILD_CACHE` if set, else
//! `<target dir>/hip-build-cache` (found from `OUT_DIR`), else `$OUT_DIR/hip-build-cache`.

use crate::detect::ResourceUsage;
use hip_codeobj::emu::fnv1a64;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

/// The cache directory for a build script whose `OUT_DIR` is `out_dir`.
pub(crate) fn root(out_dir: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("HIPK_BUILD_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    root_of(out_dir, std::env::var("TARGET").ok().as_deref())
}

/// [`root`] for a build of target triple `triple` (the build script's `TARGET`): the target
/// directory above `<profile>/build/<pkg>-<hash>/out`, or above `<triple>/<profile>/…` when
/// Cargo was given `--target` (cargo-zigbuild's portable `hip-doctor`), so that a build for an
/// explicit target reuses the kernels the host builds compiled (the kernels do not depend on
/// the Rust target).
fn root_of(out_dir: &Path, triple: Option<&str>) -> PathBuf {
    // <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out
    let mut up = out_dir.ancestors();
    match (up.nth(2), up.next(), up.next()) {
        (Some(build), Some(_profile), Some(target))
            if build.file_name().is_some_and(|n| n == "build") =>
        {
            let explicit = triple.is_some_and(|t| target.file_name().is_some_and(|n| n == t));
            match (explicit, target.parent()) {
                (true, Some(above)) => above.join("hip-build-cache"),
                _ => target.join("hip-build-cache"),
            }
        }
        _ => out_dir.join("hip-build-cache"),
    }
}

/// The key of compiling `src` with everything else that affects the result.
pub(crate) fn key(src: &Path, dirs: &[&Path], compiler: &[String]) -> String {
    let mut text = String::new();
    for c in compiler {
        let _ = writeln!(text, "{c}");
    }
    let mut h = fnv1a64(text.as_bytes());
    let mut add = |bytes: &[u8]| {
        h = h.rotate_left(5) ^ fnv1a64(bytes);
    };
    add(src.to_string_lossy().as_bytes());
    add(&fs::read(src).unwrap_or_default());
    for dir in dirs {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .map(|e| {
                e.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        for f in files {
            add(f.to_string_lossy().as_bytes());
            add(&fs::read(&f).unwrap_or_default());
        }
    }
    format!("{h:016x}")
}

/// A cached compile: the resources and the warnings; the bundle is copied to `bundle`.
pub(crate) type Hit = (Vec<(String, String, ResourceUsage)>, Vec<String>);

pub(crate) fn load(root: &Path, key: &str, bundle: &Path) -> Option<Hit> {
    let dir = root.join(key);
    let meta = fs::read_to_string(dir.join("meta.txt")).ok()?;
    let mut resources = Vec::new();
    let mut warnings = Vec::new();
    for line in meta.lines() {
        if let Some(w) = line.strip_prefix("warning ") {
            warnings.push(w.to_string());
        } else if let Some(r) = line.strip_prefix("resource ") {
            let f: Vec<&str> = r.split(' ').collect();
            let n: Vec<u32> = f
                .get(2..)?
                .iter()
                .map(|v| v.parse().ok())
                .collect::<Option<_>>()?;
            let [vgprs, sgprs, scratch_bytes, vgpr_spills, sgpr_spills, lds_bytes, occupancy] =
                n[..]
            else {
                return None;
            };
            resources.push((
                f[0].to_string(),
                f[1].to_string(),
                ResourceUsage {
                    vgprs,
                    sgprs,
                    scratch_bytes,
                    vgpr_spills,
                    sgpr_spills,
                    lds_bytes,
                    occupancy,
                },
            ));
        }
    }
    let bytes = fs::read(dir.join("bundle.hsaco")).ok()?;
    if fs::read(bundle).ok().as_deref() != Some(&bytes[..]) {
        fs::write(bundle, &bytes).ok()?;
    }
    Some((resources, warnings))
}

/// Stores a compile (best effort: a failure only costs the next build a compile).
pub(crate) fn store(
    root: &Path,
    key: &str,
    bundle: &Path,
    resources: &[(String, String, ResourceUsage)],
    warnings: &[String],
) {
    let dir = root.join(key);
    let tmp = root.join(format!(".{key}.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    if fs::create_dir_all(&tmp).is_err() || fs::copy(bundle, tmp.join("bundle.hsaco")).is_err() {
        return;
    }
    let mut meta = String::new();
    for (kernel, arch, u) in resources {
        let _ = writeln!(
            meta,
            "resource {kernel} {arch} {} {} {} {} {} {} {}",
            u.vgprs,
            u.sgprs,
            u.scratch_bytes,
            u.vgpr_spills,
            u.sgpr_spills,
            u.lds_bytes,
            u.occupancy
        );
    }
    for w in warnings {
        let _ = writeln!(meta, "warning {}", w.replace('\n', " "));
    }
    if fs::write(tmp.join("meta.txt"), meta).is_err() || fs::rename(&tmp, &dir).is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_sits_in_the_target_dir_shared_by_profiles() {
        if std::env::var_os("HIPK_BUILD_CACHE").is_some() {
            return;
        }
        let out = Path::new("/t/target/debug/build/foo-0123/out");
        assert_eq!(root(out), Path::new("/t/target/hip-build-cache"));
        let odd = Path::new("/somewhere/out");
        assert_eq!(root(odd), Path::new("/somewhere/out/hip-build-cache"));
        // `--target x86_64-unknown-linux-gnu`: the same cache as the host builds'.
        let triple = "x86_64-unknown-linux-gnu";
        let cross = Path::new("/t/target/x86_64-unknown-linux-gnu/release/build/foo-0123/out");
        let want = Path::new("/t/target/hip-build-cache");
        assert_eq!(root_of(cross, Some(triple)), want);
        // A host build (TARGET is the host triple, no triple directory).
        assert_eq!(root_of(out, Some(triple)), want);
    }

    #[test]
    fn a_stored_compile_comes_back_and_the_key_follows_the_inputs() {
        let dir = std::env::temp_dir().join(format!("hip-build-cache-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("k")).unwrap();
        let src = dir.join("k/a.hip");
        fs::write(&src, "kernel a").unwrap();
        fs::write(dir.join("k/common.h"), "v1").unwrap();
        let flags = vec!["hipcc 5.2".to_string()];
        let k1 = key(&src, &[&dir.join("k")], &flags);
        fs::write(dir.join("k/common.h"), "v2").unwrap();
        let k2 = key(&src, &[&dir.join("k")], &flags);
        assert_ne!(k1, k2, "a header change changes the key");
        assert_ne!(k2, key(&src, &[&dir.join("k")], &["hipcc 6.3".to_string()]));
        let bundle = dir.join("a.hsaco");
        fs::write(&bundle, b"bundle bytes").unwrap();
        let u = ResourceUsage {
            vgprs: 1,
            sgprs: 2,
            scratch_bytes: 3,
            vgpr_spills: 4,
            sgpr_spills: 5,
            lds_bytes: 6,
            occupancy: 7,
        };
        let res = vec![("a_f32".to_string(), "gfx906".to_string(), u)];
        store(
            &dir.join("cache"),
            &k2,
            &bundle,
            &res,
            &["w: x".to_string()],
        );
        fs::remove_file(&bundle).unwrap();
        let (got, warnings) = load(&dir.join("cache"), &k2, &bundle).unwrap();
        assert_eq!(got, res);
        assert_eq!(warnings, ["w: x"]);
        assert_eq!(fs::read(&bundle).unwrap(), b"bundle bytes");
        assert!(load(&dir.join("cache"), &k1, &bundle).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
