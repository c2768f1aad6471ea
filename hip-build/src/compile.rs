//! The process and file-system side of a kernel build: running hipcc (arch probes, one compile
//! per source), reading its resource records, writing the generated file. The rules it applies
//! live in [`crate::detect`], with table tests.

use crate::detect::{self, BuiltSource, ResourceUsage};
use crate::emu_build::EmuBuild;
use crate::names::{self, SourceKernels};
use hip_codeobj::bundle::Bundle;
use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Flags every kernel compile gets besides the archs, sources, include dirs and outputs.
pub const HIPCC_FLAGS: &[&str] = &[
    "--genco",
    "-O3",
    "-std=c++17",
    "-Rpass-analysis=kernel-resource-usage",
    "-fsave-optimization-record",
    "-foptimization-record-passes=kernel-resource-usage",
];

/// A kernel build, configured by [`crate::Builder`].
pub(crate) struct Job<'a> {
    /// Prefix of every warning and panic message (the crate being built).
    pub name: &'a str,
    pub kernels_dir: &'a Path,
    pub include_dirs: &'a [PathBuf],
    pub flags: &'a [String],
    pub out_dir: &'a Path,
    /// The crate's root: `__FILE__` and hip-emu's reports name sources relative to it.
    pub manifest_dir: &'a Path,
    pub out_file: &'a str,
    /// Why the kernels are required (a panic instead of a warning when they cannot be built).
    pub required: Option<&'a str>,
    /// The committed names file (absolute), read when the kernels are not compiled.
    pub names_file: Option<&'a Path>,
    /// Extra archs per source stem ([`crate::Builder::source_archs`]).
    pub source_archs: &'a [(String, Vec<String>)],
    /// First line of `hipcc --version` (set by `run`; part of the cache key).
    pub version: String,
}

/// Name of the generated kernel-name constants in `OUT_DIR` ([`crate::names`]).
pub const NAMES_OUT_FILE: &str = "kernel_names.rs";

impl Job<'_> {
    /// Compile every `*.hip` of the kernels directory and write the generated file; see
    /// [`crate::Builder::build`].
    pub fn run(&mut self) -> crate::Outcome {
        for var in detect::ENV_VARS {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let name = self.name;
        let sources = self.kernel_sources();
        if sources.is_empty() {
            // Nothing to compile: no hipcc search, no arch probe, no warning.
            self.write_generated(None, "", &[], None, &[]);
            write_names(name, self.out_dir, "no kernel sources", &[]);
            return crate::Outcome::Built {
                archs: Vec::new(),
                sources: Vec::new(),
            };
        }
        for dir in self.include_dirs {
            println!("cargo:rerun-if-changed={}", dir.display());
        }
        let hipcc = match detect::find_hipcc(&|k| env::var_os(k), &|p| p.is_file()) {
            Ok((path, _origin)) => path,
            Err(e @ detect::HipccError::ExplicitMissing { .. }) => panic!("{name}: {e}"),
            Err(e @ detect::HipccError::NotFound) => {
                return self.not_built(None, "", &e.to_string())
            }
        };
        let hipcc_str = hipcc.display().to_string();
        let version = hipcc_version(name, &hipcc);
        self.version = version.clone();
        let archs = select_archs(name, &hipcc, &version, self.out_dir);
        if archs.is_empty() {
            let msg = format!(
                "{hipcc_str} accepts none of the DCU archs {:?}; {}",
                detect::DCU_ARCHS,
                detect::HOW_TO_GET_HIPCC
            );
            return self.not_built(Some(&hipcc_str), &version, &msg);
        }
        let extra = self.extra_archs(&hipcc, &version, &archs);
        let mut includes = vec![self.kernels_dir.to_path_buf()];
        includes.extend(self.include_dirs.iter().cloned());
        let emu = EmuBuild::new(name, self.out_dir, self.manifest_dir, &includes);
        let built = self.compile_all(&hipcc, &archs, &extra, &sources, &emu);
        emu.finish();
        self.write_generated(Some(&hipcc_str), &version, &archs, None, &built);
        let names = compiled_names(name, &archs[0], &built);
        self.check_names_file(&names);
        write_names(
            name,
            self.out_dir,
            &format!("the {} code objects", archs[0]),
            &names,
        );
        crate::Outcome::Built {
            archs,
            sources: built.into_iter().map(|b| b.name).collect(),
        }
    }

    /// No kernels: a panic when they are required, else a warning and the not-built file.
    fn not_built(&self, hipcc: Option<&str>, version: &str, msg: &str) -> crate::Outcome {
        if let Some(why) = self.required {
            panic!("{}: {why} needs the HIP kernels, but {msg}", self.name);
        }
        println!("cargo:warning={}: kernels not built: {msg}", self.name);
        self.write_generated(hipcc, version, &[], Some(msg), &[]);
        write_names_from_file(self.name, self.out_dir, self.names_file);
        crate::Outcome::NotBuilt(msg.to_string())
    }

    /// `*.hip` of the kernels directory, sorted; registers every file there (sources and
    /// headers) for rerun.
    fn kernel_sources(&self) -> Vec<PathBuf> {
        let kernels_dir = self.kernels_dir;
        println!("cargo:rerun-if-changed={}", kernels_dir.display());
        let entries = fs::read_dir(kernels_dir).unwrap_or_else(|e| {
            panic!("{}: cannot read {}: {e}", self.name, kernels_dir.display())
        });
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in &files {
            println!("cargo:rerun-if-changed={}", f.display());
        }
        files.retain(|f| f.extension().is_some_and(|e| e == "hip"));
        files
    }
}

/// First non-empty line of `hipcc --version` (stdout), or "" when it prints nothing.
fn hipcc_version(name: &str, hipcc: &Path) -> String {
    let out = Command::new(hipcc)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{name}: cannot run `{} --version`: {e}", hipcc.display()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// `HIPK_ARCH` if set (every entry must be accepted), else the DCU set filtered to what the
/// compiler accepts, with a warning per dropped arch. Probe results are cached in OUT_DIR per
/// (hipcc path, version).
fn select_archs(name: &str, hipcc: &Path, version: &str, out_dir: &Path) -> Vec<String> {
    let explicit = env::var("HIPK_ARCH").ok().filter(|v| !v.trim().is_empty());
    let wanted: Vec<String> = match &explicit {
        Some(v) => detect::parse_arch_list(v).unwrap_or_else(|e| panic!("{name}: {e}")),
        None => detect::DCU_ARCHS.iter().map(|s| s.to_string()).collect(),
    };
    let probed = probe_archs(name, hipcc, version, out_dir, &wanted);
    let mut accepted = Vec::new();
    let mut rejected = Vec::new();
    for (arch, result) in wanted.iter().zip(probed) {
        match result {
            Ok(()) => accepted.push(arch.clone()),
            Err(why) => rejected.push((arch.clone(), why)),
        }
    }
    if explicit.is_some() && !rejected.is_empty() {
        let list: Vec<String> = rejected
            .iter()
            .map(|(a, why)| format!("{a}: {why}"))
            .collect();
        panic!(
            "{name}: HIPK_ARCH asks for archs that {} rejects:\n{}\nUse a compiler that \
             supports them (DTK's hipcc for gfx926/928/936/938) or remove them from HIPK_ARCH.",
            hipcc.display(),
            list.join("\n")
        );
    }
    if !rejected.is_empty() {
        // One warning for all of them, and once per cargo invocation: the other crates of the
        // same build that compile kernels with the same compiler would only repeat it.
        let names: Vec<&str> = rejected.iter().map(|(a, _)| a.as_str()).collect();
        let detail = format!(
            "kernels built for {}; dropped {} ({} does not accept them: {}); use DTK's hipcc to \
             build them, or set HIPK_ARCH={} to build only those",
            accepted.join(","),
            names.join(", "),
            hipcc.display(),
            rejected[0].1,
            accepted.join(",")
        );
        if crate::once::first_in_invocation(&crate::cache::root(out_dir), &detail) {
            println!("cargo:warning={name}: {detail}");
        }
    }
    accepted
}

/// Compiles a one-line kernel for each arch (in parallel); Ok when the compiler accepts it.
fn probe_archs(
    name: &str,
    hipcc: &Path,
    version: &str,
    out_dir: &Path,
    archs: &[String],
) -> Vec<Result<(), String>> {
    let probe_dir = crate::cache::root(out_dir).join("arch-probe");
    fs::create_dir_all(&probe_dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    let probe = "#include <hip/hip_runtime.h>\n\
                 extern \"C\" __global__ void hipk_probe(float* x) { x[threadIdx.x] = 1.0f; }\n";
    let mut h = DefaultHasher::new();
    (hipcc, version, probe).hash(&mut h);
    let key = format!("{:016x}", h.finish());
    let cache_path = probe_dir.join("cache.txt");
    // Cache lines: `<key> <arch> ok` or `<key> <arch> rejected <reason>`.
    let cached = fs::read_to_string(&cache_path).unwrap_or_default();
    let lookup = |arch: &str| -> Option<Result<(), String>> {
        cached.lines().find_map(|l| {
            let mut parts = l.splitn(4, ' ');
            if parts.next()? != key || parts.next()? != arch {
                return None;
            }
            match parts.next()? {
                "ok" => Some(Ok(())),
                _ => Some(Err(parts.next().unwrap_or("rejected").to_string())),
            }
        })
    };
    let src = probe_dir.join("probe.hip");
    fs::write(&src, probe)
        .unwrap_or_else(|e| panic!("{name}: cannot write {}: {e}", src.display()));
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = archs
            .iter()
            .map(|arch| {
                let cachedv = lookup(arch);
                let (src, probe_dir) = (&src, &probe_dir);
                s.spawn(move || {
                    cachedv.unwrap_or_else(|| {
                        let out = probe_dir.join(format!("probe-{}.hsaco", arch.replace(':', "_")));
                        let res = Command::new(hipcc)
                            .arg("--genco")
                            .arg(format!("--offload-arch={arch}"))
                            .arg(src)
                            .arg("-o")
                            .arg(&out)
                            .output();
                        match res {
                            Ok(o) if o.status.success() => Ok(()),
                            Ok(o) => Err(first_error_line(&String::from_utf8_lossy(&o.stderr))),
                            Err(e) => Err(format!("cannot run hipcc: {e}")),
                        }
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("probe thread panicked".into()))
            })
            .collect()
    });
    let mut lines: Vec<String> = cached
        .lines()
        .filter(|l| !l.starts_with(&key))
        .map(String::from)
        .collect();
    for (arch, r) in archs.iter().zip(&results) {
        lines.push(match r {
            Ok(()) => format!("{key} {arch} ok"),
            Err(why) => format!("{key} {arch} rejected {}", why.replace('\n', " ")),
        });
    }
    let _ = fs::write(&cache_path, lines.join("\n") + "\n");
    results
}

fn first_error_line(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.contains("error"))
        .or_else(|| stderr.lines().find(|l| !l.trim().is_empty()))
        .unwrap_or("compiler failed without a message")
        .split("; format is")
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

impl Job<'_> {
    /// The accepted extra archs of each source named in `source_archs` (not already among the
    /// common `archs`); a warning for each one the compiler rejects.
    fn extra_archs(
        &self,
        hipcc: &Path,
        version: &str,
        archs: &[String],
    ) -> Vec<(String, Vec<String>)> {
        let mut wanted: Vec<String> = Vec::new();
        for (_, list) in self.source_archs {
            for a in list {
                if !archs.contains(a) && !wanted.contains(a) {
                    wanted.push(a.clone());
                }
            }
        }
        if wanted.is_empty() {
            return Vec::new();
        }
        let probed = probe_archs(self.name, hipcc, version, self.out_dir, &wanted);
        let mut accepted = Vec::new();
        for (arch, r) in wanted.iter().zip(probed) {
            match r {
                Ok(()) => accepted.push(arch.clone()),
                Err(why) => println!(
                    "cargo:warning={}: extra arch {arch} dropped: {} does not accept it ({why})",
                    self.name,
                    hipcc.display()
                ),
            }
        }
        self.source_archs
            .iter()
            .map(|(src, list)| {
                let ok = list.iter().filter(|a| accepted.contains(a)).cloned();
                (src.clone(), ok.collect())
            })
            .collect()
    }

    /// Compiles every source (in parallel, up to NUM_JOBS at once), each for the common archs
    /// plus its extra ones; panics listing every failed compile with its full command and stderr.
    fn compile_all(
        &self,
        hipcc: &Path,
        archs: &[String],
        extra: &[(String, Vec<String>)],
        sources: &[PathBuf],
        emu: &EmuBuild,
    ) -> Vec<BuiltSource> {
        let jobs = env::var("NUM_JOBS")
            .ok()
            .and_then(|j| j.parse::<usize>().ok())
            .unwrap_or(4);
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<(usize, Result<BuiltSource, String>)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..jobs.clamp(1, sources.len().max(1)) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(src) = sources.get(i) else { break };
                    let stem = src.file_stem().map(|s| s.to_string_lossy().into_owned());
                    let mut all = archs.to_vec();
                    for (source, list) in extra {
                        if stem.as_deref() == Some(source.as_str()) {
                            all.extend(list.iter().filter(|a| !archs.contains(a)).cloned());
                        }
                    }
                    let r = self.compile_one(hipcc, &all, src);
                    if let Ok(b) = &r {
                        emu.add(src, &b.bundle_path);
                    }
                    if let Ok(mut v) = results.lock() {
                        v.push((i, r));
                    }
                });
            }
        });
        let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
        results.sort_by_key(|(i, _)| *i);
        let mut built = Vec::new();
        let mut failures = Vec::new();
        for (_, r) in results {
            match r {
                Ok(b) => built.push(b),
                Err(e) => failures.push(e),
            }
        }
        if !failures.is_empty() {
            panic!(
                "{}: kernel compile failed\n\n{}",
                self.name,
                failures.join("\n\n")
            );
        }
        built
    }

    /// One hipcc run for one source and all archs; then the per-arch resource records.
    fn compile_one(
        &self,
        hipcc: &Path,
        archs: &[String],
        src: &Path,
    ) -> Result<BuiltSource, String> {
        let out_dir = self.out_dir;
        let name = src
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let bundle_path = out_dir.join(format!("{name}.hsaco"));
        let cache_root = crate::cache::root(out_dir);
        let mut compiler = vec![hipcc.display().to_string(), self.version.clone()];
        compiler.extend(archs.iter().cloned());
        compiler.extend(HIPCC_FLAGS.iter().map(|f| f.to_string()));
        compiler.extend(self.flags.iter().cloned());
        let mut dirs: Vec<&Path> = vec![self.kernels_dir];
        dirs.extend(self.include_dirs.iter().map(PathBuf::as_path));
        let key = crate::cache::key(src, &dirs, &compiler);
        if let Some((resources, warnings)) = crate::cache::load(&cache_root, &key, &bundle_path) {
            for w in warnings {
                println!("cargo:warning={}: {name}: {w}", self.name);
            }
            return Ok(BuiltSource {
                name,
                bundle_path,
                resources,
            });
        }
        let work = out_dir.join("kernel-build").join(&name);
        let _ = fs::remove_dir_all(&work);
        fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
        let mut cmd = Command::new(hipcc);
        cmd.current_dir(&work).args(HIPCC_FLAGS).args(self.flags);
        for arch in archs {
            cmd.arg(format!("--offload-arch={arch}"));
        }
        cmd.arg("-I").arg(self.kernels_dir);
        for dir in self.include_dirs {
            cmd.arg("-I").arg(dir);
        }
        cmd.arg(src).arg("-o").arg(&bundle_path);
        let out = cmd
            .output()
            .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(format!(
                "command: {cmd:?}\nexit: {}\nstderr:\n{stderr}",
                out.status
            ));
        }
        let warnings: Vec<String> = stderr
            .lines()
            .filter(|l| l.contains("warning:"))
            .take(20)
            .map(String::from)
            .collect();
        for line in &warnings {
            println!("cargo:warning={}: {name}: {line}", self.name);
        }
        let resources = collect_resources(self.name, &name, archs, &work, &stderr);
        crate::cache::store(&cache_root, &key, &bundle_path, &resources, &warnings);
        let _ = fs::remove_dir_all(&work);
        Ok(BuiltSource {
            name,
            bundle_path,
            resources,
        })
    }

    fn write_generated(
        &self,
        hipcc: Option<&str>,
        version: &str,
        archs: &[String],
        not_built: Option<&str>,
        built: &[BuiltSource],
    ) {
        let text = detect::render_generated(hipcc, version, archs, not_built, built);
        write_if_changed(self.name, &self.out_dir.join(self.out_file), &text);
    }
}

impl Job<'_> {
    /// A warning when the names file no longer matches the compiled kernels (the build goes on
    /// with the compiled names; builds without kernels would use the stale file).
    fn check_names_file(&self, compiled: &[SourceKernels]) {
        let Some(path) = self.names_file else { return };
        println!("cargo:rerun-if-changed={}", path.display());
        let committed = fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| names::parse_names_file(&t));
        if committed.as_deref() != Ok(compiled) {
            println!(
                "cargo:warning={}: {} does not list exactly the compiled kernels; rewrite it from \
                 this build (hip-kernels: `HIPK_BLESS=1 cargo test --test kernels_static`)",
                self.name,
                path.display()
            );
        }
    }
}

/// The kernel symbols of every built bundle's code object for `arch`. A bundle that cannot be
/// read is a build error (hipcc just wrote it).
fn compiled_names(crate_name: &str, arch: &str, built: &[BuiltSource]) -> Vec<SourceKernels> {
    let names = built.iter().map(|b| {
        let fail = |what: String| -> ! {
            panic!(
                "{crate_name}: reading the kernel names of {}: {what}",
                b.bundle_path.display()
            )
        };
        let bytes = fs::read(&b.bundle_path).unwrap_or_else(|e| fail(e.to_string()));
        let bundle = Bundle::parse(&bytes).unwrap_or_else(|e| fail(e.to_string()));
        let entry = bundle
            .gpu_entries()
            .find(|e| e.target_id() == Some(arch))
            .unwrap_or_else(|| fail(format!("no code object for {arch}")));
        let kernels = entry.kernel_names().unwrap_or_else(|e| fail(e.to_string()));
        (b.name.clone(), kernels)
    });
    names::normalise(names.collect())
}

/// The names from the committed names file, or none (with a warning if the file is configured
/// but missing). A malformed file is a build error naming the line.
pub(crate) fn write_names_from_file(crate_name: &str, out_dir: &Path, file: Option<&Path>) {
    let Some(path) = file else {
        return write_names(
            crate_name,
            out_dir,
            "no names file (kernels not built)",
            &[],
        );
    };
    println!("cargo:rerun-if-changed={}", path.display());
    let names = match fs::read_to_string(path) {
        Ok(text) => names::parse_names_file(&text)
            .unwrap_or_else(|e| panic!("{crate_name}: {}: {e}", path.display())),
        Err(e) => {
            println!(
                "cargo:warning={crate_name}: cannot read the kernel names file {}: {e}; no \
                 kernel-name constants",
                path.display()
            );
            Vec::new()
        }
    };
    let shown = path.file_name().map_or_else(
        || path.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    write_names(crate_name, out_dir, &shown, &names);
}

fn write_names(crate_name: &str, out_dir: &Path, from: &str, names: &[SourceKernels]) {
    let text = names::render_names_module(from, names);
    write_if_changed(crate_name, &out_dir.join(NAMES_OUT_FILE), &text);
}

/// Reads the per-arch optimization records in `work`; falls back to the text remarks when only
/// one arch was built. Anything missing or unparsable is a warning (the static gate test then
/// fails on the missing rows).
fn collect_resources(
    crate_name: &str,
    name: &str,
    archs: &[String],
    work: &Path,
    stderr: &str,
) -> Vec<(String, String, ResourceUsage)> {
    let mut per_arch: Vec<(String, String)> = Vec::new();
    if let Ok(entries) = fs::read_dir(work) {
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if let Some(arch) = detect::arch_from_opt_record_name(&file) {
                if let Ok(text) = fs::read_to_string(entry.path()) {
                    per_arch.push((arch.to_string(), text));
                }
            }
        }
    }
    let mut rows = Vec::new();
    for arch in archs {
        let records = match per_arch.iter().find(|(a, _)| a == arch) {
            Some((_, text)) => detect::parse_opt_record_yaml(text),
            None if archs.len() == 1 => detect::parse_remarks(stderr),
            None => {
                println!(
                    "cargo:warning={crate_name}: {name}: no optimization record for {arch}; its \
                     resource figures are missing from the table"
                );
                continue;
            }
        };
        for record in records {
            match record {
                Ok((kernel, usage)) => rows.push((kernel, arch.clone(), usage)),
                Err(e) => println!("cargo:warning={crate_name}: {name} ({arch}): {e}"),
            }
        }
    }
    rows
}

/// Write `text` to `path` unless it already holds exactly that (no rebuild of dependents).
pub(crate) fn write_if_changed(name: &str, path: &Path, text: &str) {
    if fs::read_to_string(path).ok().as_deref() != Some(text) {
        fs::write(path, text)
            .unwrap_or_else(|e| panic!("{name}: cannot write {}: {e}", path.display()));
    }
}
