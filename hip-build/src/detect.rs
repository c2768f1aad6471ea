//! The rules of a kernel build, free of processes and files: where hipcc is looked for, which
//! archs are built, how the compiler's resource remarks are read, and what the generated file
//! holds. Table tests in `detect_tests.rs` run without hipcc. Only `std` is used.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The Hygon DCU targets built when `HIPK_ARCH` is unset (filtered to what the compiler accepts).
pub const DCU_ARCHS: &[&str] = &["gfx906", "gfx926", "gfx928", "gfx936", "gfx938"];

/// Every environment variable the kernel build reads (each one is a `rerun-if-env-changed`).
pub const ENV_VARS: &[&str] = &[
    "HIPK_HIPCC",
    "HIPCC",
    "ROCM_PATH",
    "HIP_PATH",
    "HIPK_ARCH",
    "PATH",
];

/// What a user without hipcc is told (build warning, `KernelsNotBuilt` error, `device` failure).
pub const HOW_TO_GET_HIPCC: &str = "install DTK and `source /opt/dtk/env.sh` (its hipcc builds \
every DCU arch), or on Debian/Ubuntu `apt-get install hipcc` (gfx906 only); or point HIPK_HIPCC \
at a hipcc binary; then rebuild";

/// Where a hipcc candidate came from (reported in warnings and errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HipccOrigin {
    /// `HIPK_HIPCC` (explicit: must exist).
    HipkHipcc,
    /// `HIPCC` (explicit: must exist).
    Hipcc,
    /// `$ROCM_PATH/bin/hipcc`.
    RocmPath,
    /// `$HIP_PATH/bin/hipcc`.
    HipPath,
    /// `/opt/dtk/bin/hipcc`.
    OptDtk,
    /// `/opt/rocm/bin/hipcc`.
    OptRocm,
    /// An entry of `PATH`.
    Path,
}

impl HipccOrigin {
    /// True for the variables that name hipcc explicitly: a missing file there is an error,
    /// not a reason to look further.
    pub fn is_explicit(self) -> bool {
        matches!(self, HipccOrigin::HipkHipcc | HipccOrigin::Hipcc)
    }
}

/// Why no usable hipcc was selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HipccError {
    /// `HIPK_HIPCC` or `HIPCC` names a file that does not exist.
    ExplicitMissing {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// No candidate exists.
    NotFound,
}

impl fmt::Display for HipccError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HipccError::ExplicitMissing { var, value } => write!(
                f,
                "{var}={value:?} does not name an existing hipcc; fix or unset {var}"
            ),
            HipccError::NotFound => write!(
                f,
                "no hipcc found (searched HIPK_HIPCC, HIPCC, $ROCM_PATH/bin, $HIP_PATH/bin, \
                 /opt/dtk/bin, /opt/rocm/bin, PATH): {HOW_TO_GET_HIPCC}"
            ),
        }
    }
}

/// The hipcc candidates in search order: `HIPK_HIPCC`, `HIPCC`, `$ROCM_PATH/bin`, `$HIP_PATH/bin`,
/// `/opt/dtk/bin`, `/opt/rocm/bin`, then each `PATH` entry. A bare name in `HIPK_HIPCC`/`HIPCC`
/// (no `/`) is looked up in `PATH`.
pub fn hipcc_candidates(env: &dyn Fn(&str) -> Option<OsString>) -> Vec<(PathBuf, HipccOrigin)> {
    let path_dirs: Vec<PathBuf> = env("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (var, origin) in [
        ("HIPK_HIPCC", HipccOrigin::HipkHipcc),
        ("HIPCC", HipccOrigin::Hipcc),
    ] {
        if let Some(value) = env(var).filter(|v| !v.is_empty()) {
            let named = PathBuf::from(&value);
            if named.components().count() == 1 && !named.is_absolute() {
                out.extend(path_dirs.iter().map(|d| (d.join(&named), origin)));
            } else {
                out.push((named, origin));
            }
        }
    }
    for (var, origin) in [
        ("ROCM_PATH", HipccOrigin::RocmPath),
        ("HIP_PATH", HipccOrigin::HipPath),
    ] {
        if let Some(root) = env(var).filter(|v| !v.is_empty()) {
            out.push((PathBuf::from(root).join("bin").join("hipcc"), origin));
        }
    }
    out.push((PathBuf::from("/opt/dtk/bin/hipcc"), HipccOrigin::OptDtk));
    out.push((PathBuf::from("/opt/rocm/bin/hipcc"), HipccOrigin::OptRocm));
    out.extend(
        path_dirs
            .iter()
            .map(|d| (d.join("hipcc"), HipccOrigin::Path)),
    );
    out
}

/// Picks the first existing candidate. An explicit variable (`HIPK_HIPCC`, `HIPCC`) whose
/// candidates all miss is an error rather than a silent fall-through to another compiler.
pub fn find_hipcc(
    env: &dyn Fn(&str) -> Option<OsString>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<(PathBuf, HipccOrigin), HipccError> {
    let candidates = hipcc_candidates(env);
    for var in ["HIPK_HIPCC", "HIPCC"] {
        let origin = if var == "HIPK_HIPCC" {
            HipccOrigin::HipkHipcc
        } else {
            HipccOrigin::Hipcc
        };
        let mut of_var = candidates.iter().filter(|(_, o)| *o == origin).peekable();
        if of_var.peek().is_some() {
            return match of_var.find(|(p, _)| exists(p)) {
                Some(found) => Ok(found.clone()),
                None => Err(HipccError::ExplicitMissing {
                    var,
                    value: env(var).unwrap_or_default().to_string_lossy().into_owned(),
                }),
            };
        }
    }
    candidates
        .into_iter()
        .find(|(p, _)| exists(p))
        .ok_or(HipccError::NotFound)
}

/// A malformed `HIPK_ARCH` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchError {
    /// The offending entry.
    pub entry: String,
}

impl fmt::Display for ArchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HIPK_ARCH entry {:?} is not an AMDGPU target (expected e.g. gfx906 or \
             gfx906:xnack-, comma-separated)",
            self.entry
        )
    }
}

/// Parses a comma-separated `HIPK_ARCH` value into target ids, trimming blanks and dropping
/// duplicates (first occurrence kept). An empty list is an error.
pub fn parse_arch_list(value: &str) -> Result<Vec<String>, ArchError> {
    let mut out: Vec<String> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if !is_target_id(entry) {
            return Err(ArchError {
                entry: entry.to_string(),
            });
        }
        if !out.iter().any(|a| a == entry) {
            out.push(entry.to_string());
        }
    }
    if out.is_empty() {
        return Err(ArchError {
            entry: value.to_string(),
        });
    }
    Ok(out)
}

/// `gfx<hex digits>` optionally followed by `:feature+` / `:feature-` parts.
fn is_target_id(s: &str) -> bool {
    let mut parts = s.split(':');
    let proc_ok = parts.next().is_some_and(|p| {
        p.len() > 3 && p.starts_with("gfx") && p[3..].chars().all(|c| c.is_ascii_hexdigit())
    });
    proc_ok
        && parts.all(|f| {
            f.len() > 1
                && (f.ends_with('+') || f.ends_with('-'))
                && f[..f.len() - 1].chars().all(|c| c.is_ascii_alphanumeric())
        })
}

/// The processor part of a target id (`gfx906:xnack-` → `gfx906`).
pub fn arch_processor(target_id: &str) -> &str {
    target_id.split(':').next().unwrap_or(target_id)
}

/// Per-kernel figures from `-Rpass-analysis=kernel-resource-usage`, for one arch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// Vector registers per lane.
    pub vgprs: u32,
    /// Scalar registers per wave.
    pub sgprs: u32,
    /// Private (scratch) memory in bytes per lane.
    pub scratch_bytes: u32,
    /// VGPRs spilled to scratch.
    pub vgpr_spills: u32,
    /// SGPRs spilled (to VGPR lanes or scratch).
    pub sgpr_spills: u32,
    /// Static LDS per block in bytes.
    pub lds_bytes: u32,
    /// Waves per SIMD the register and LDS use allow.
    pub occupancy: u32,
}

/// A resource-usage record that could not be completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemarkError {
    /// Kernel whose record is incomplete.
    pub kernel: String,
    /// Fields the compiler did not report.
    pub missing: Vec<&'static str>,
}

impl fmt::Display for RemarkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel-resource-usage remarks for {} lack {}: the compiler's remark format is not \
             one this build knows",
            self.kernel,
            self.missing.join(", ")
        )
    }
}

/// Field labels as the compiler prints them (text remarks) and their YAML keys.
const FIELDS: &[(&str, &str, &str)] = &[
    // (name, text label, yaml key)
    ("vgprs", "VGPRs", "NumVGPR"),
    ("sgprs", "SGPRs", "NumSGPR"),
    ("scratch_bytes", "ScratchSize [bytes/lane]", "ScratchSize"),
    ("vgpr_spills", "VGPRs Spill", "VGPRSpill"),
    ("sgpr_spills", "SGPRs Spill", "SGPRSpill"),
    ("lds_bytes", "LDS Size [bytes/block]", "BytesLDS"),
    ("occupancy", "Occupancy [waves/SIMD]", "Occupancy"),
];

/// Accumulates field values for consecutive kernels.
#[derive(Default)]
struct Collector {
    done: Vec<Result<(String, ResourceUsage), RemarkError>>,
    current: Option<(String, [Option<u32>; 7])>,
}

impl Collector {
    fn start(&mut self, kernel: &str) {
        self.finish();
        self.current = Some((kernel.to_string(), [None; 7]));
    }

    fn field(&mut self, index: usize, value: u32) {
        if let Some((_, fields)) = self.current.as_mut() {
            fields[index] = Some(value);
        }
    }

    fn finish(&mut self) {
        let Some((kernel, f)) = self.current.take() else {
            return;
        };
        let missing: Vec<&'static str> = FIELDS
            .iter()
            .zip(f.iter())
            .filter(|(_, v)| v.is_none())
            .map(|((name, _, _), _)| *name)
            .collect();
        // A function that is not a kernel (device printf's `__ockl_hostcall_internal`, any
        // callable device function) gets every figure but LDS, which the compiler gives kernels
        // only: not a kernel's record, and not a format this build fails to know.
        if missing == ["lds_bytes"] {
            return;
        }
        self.done.push(match f {
            [Some(vgprs), Some(sgprs), Some(scratch_bytes), Some(vgpr_spills), Some(sgpr_spills), Some(lds_bytes), Some(occupancy)] => {
                Ok((
                    kernel,
                    ResourceUsage {
                        vgprs,
                        sgprs,
                        scratch_bytes,
                        vgpr_spills,
                        sgpr_spills,
                        lds_bytes,
                        occupancy,
                    },
                ))
            }
            _ => Err(RemarkError { kernel, missing }),
        });
    }

    fn into_records(mut self) -> Vec<Result<(String, ResourceUsage), RemarkError>> {
        self.finish();
        self.done
    }
}

/// Parses the compiler's text remarks (stderr of `-Rpass-analysis=kernel-resource-usage`):
///
/// ```text
/// f.hip:3:1: remark: Function Name: k_f32 [-Rpass-analysis=kernel-resource-usage]
/// f.hip:3:1: remark:     VGPRs: 30 [-Rpass-analysis=kernel-resource-usage]
/// ```
///
/// Records come out in the order printed; with several archs in one compile the text does not
/// say which arch a record belongs to (use [`parse_opt_record_yaml`] for that).
pub fn parse_remarks(stderr: &str) -> Vec<Result<(String, ResourceUsage), RemarkError>> {
    let mut c = Collector::default();
    for line in stderr.lines() {
        if !line.contains("[-Rpass-analysis=kernel-resource-usage]") {
            continue;
        }
        let Some((_, rest)) = line.split_once("remark:") else {
            continue;
        };
        let text = rest.split(" [-Rpass-analysis").next().unwrap_or("").trim();
        let Some((label, value)) = text.rsplit_once(':') else {
            continue;
        };
        let (label, value) = (label.trim(), value.trim());
        if label == "Function Name" {
            c.start(value);
        } else if let Some(i) = FIELDS.iter().position(|(_, l, _)| *l == label) {
            if let Ok(v) = value.parse() {
                c.field(i, v);
            }
        }
    }
    c.into_records()
}

/// Parses an optimization-record YAML file written by `-fsave-optimization-record` (one per
/// arch, `<stem>-hip-amdgcn-amd-amdhsa-<arch>.opt.yaml`), keeping `kernel-resource-usage`
/// entries. Each entry names its function and carries one `Key: 'value'` argument.
pub fn parse_opt_record_yaml(text: &str) -> Vec<Result<(String, ResourceUsage), RemarkError>> {
    let mut c = Collector::default();
    for doc in text.split("\n---").map(|d| d.trim_start_matches("---")) {
        let mut pass = None;
        let mut name = None;
        let mut values: Vec<(&str, &str)> = Vec::new();
        for line in doc.lines() {
            let line = line.trim();
            let Some((key, value)) = line.trim_start_matches("- ").split_once(':') else {
                continue;
            };
            let (key, value) = (
                key.trim(),
                value.trim().trim_matches('\'').trim_matches('"'),
            );
            match key {
                "Pass" => pass = Some(value),
                "Name" => name = Some(value),
                _ => values.push((key, value)),
            }
        }
        if pass != Some("kernel-resource-usage") {
            continue;
        }
        let lookup = |k: &str| values.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        match name {
            Some("FunctionName") => {
                if let Some(kernel) = lookup("FunctionName") {
                    c.start(kernel);
                }
            }
            Some(other) => {
                if let Some(i) = FIELDS.iter().position(|(_, _, y)| *y == other) {
                    if let Some(v) = lookup(other).and_then(|v| v.parse().ok()) {
                        c.field(i, v);
                    }
                }
            }
            None => {}
        }
    }
    c.into_records()
}

/// The target id in an optimization-record file name
/// (`layernorm-hip-amdgcn-amd-amdhsa-gfx906.opt.yaml` → `gfx906`).
pub fn arch_from_opt_record_name(file_name: &str) -> Option<&str> {
    let stem = file_name.strip_suffix(".opt.yaml")?;
    let (_, arch) = stem.rsplit_once("amdgcn-amd-amdhsa-")?;
    let arch = arch.trim_start_matches('-');
    (!arch.is_empty()).then_some(arch)
}

/// One compiled kernel source, as recorded in the generated file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltSource {
    /// File stem (`layernorm` for `kernels/layernorm.hip`).
    pub name: String,
    /// Absolute path of the offload bundle to embed.
    pub bundle_path: PathBuf,
    /// (kernel, arch, figures) for every kernel and arch.
    pub resources: Vec<(String, String, ResourceUsage)>,
}

/// Renders the generated Rust file: build facts, one `include_bytes!` constant per bundle, and
/// the resource table. `not_built` is the reason kernels are absent (then `sources` is empty).
/// The names it uses (`Bundle`, `KernelResources`, `ResourceUsage`) must be in scope where the
/// file is `include!`d. Every item is `#[allow(dead_code)]`: a crate that reads only `BUNDLES`
/// from a private module gets no warning for the others.
pub fn render_generated(
    hipcc: Option<&str>,
    hipcc_version: &str,
    archs: &[String],
    not_built: Option<&str>,
    sources: &[BuiltSource],
) -> String {
    use std::fmt::Write as _;
    let mut s = String::from("// @generated by hip-build; do not edit.\n");
    let _ = writeln!(s, "/// The hipcc that built the kernels, if any.");
    let _ = writeln!(
        s,
        "#[allow(dead_code)]\npub const HIPCC: Option<&str> = {hipcc:?};"
    );
    let _ = writeln!(
        s,
        "/// First line of `hipcc --version` (empty without hipcc)."
    );
    let _ = writeln!(
        s,
        "#[allow(dead_code)]\npub const HIPCC_VERSION: &str = {hipcc_version:?};"
    );
    let _ = writeln!(s, "/// Target ids every bundle was compiled for.");
    let _ = writeln!(
        s,
        "#[allow(dead_code)]\npub const ARCHS: &[&str] = &{archs:?};"
    );
    let _ = writeln!(s, "/// Why no kernels were built (`None` when they were).");
    let _ = writeln!(
        s,
        "#[allow(dead_code)]\npub const NOT_BUILT: Option<&str> = {not_built:?};"
    );
    let _ = writeln!(s, "/// One offload bundle per `kernels/*.hip`.");
    let _ = writeln!(s, "#[allow(dead_code)]\npub const BUNDLES: &[Bundle] = &[");
    for src in sources {
        let _ = writeln!(
            s,
            "    Bundle {{ source: {:?}, bytes: include_bytes!({:?}) }},",
            src.name,
            src.bundle_path.display().to_string()
        );
    }
    let _ = writeln!(s, "];");
    let _ = writeln!(
        s,
        "/// Compiler-reported resource usage per kernel and arch."
    );
    let _ = writeln!(
        s,
        "#[allow(dead_code)]\npub const RESOURCES: &[KernelResources] = &["
    );
    for src in sources {
        for (kernel, arch, u) in &src.resources {
            let _ = writeln!(
                s,
                "    KernelResources {{ source: {:?}, kernel: {kernel:?}, arch: {arch:?}, usage: \
                 ResourceUsage {{ vgprs: {}, sgprs: {}, scratch_bytes: {}, vgpr_spills: {}, \
                 sgpr_spills: {}, lds_bytes: {}, occupancy: {} }} }},",
                src.name,
                u.vgprs,
                u.sgprs,
                u.scratch_bytes,
                u.vgpr_spills,
                u.sgpr_spills,
                u.lds_bytes,
                u.occupancy
            );
        }
    }
    let _ = writeln!(s, "];");
    s
}
