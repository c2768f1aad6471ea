//! The host build of HIP kernels for hip-emu, the emulated HIP device on the CPU.
//!
//! [`HostCompiler::compile`] compiles one kernel source as ordinary host C++ (clang++ >= 15,
//! C++17, `-O2`) against the shim in `shim/` (shipped inside this crate: [`SHIM_FILES`]), which
//! replaces the HIP device builtins (`__syncthreads`, shuffles, DPP, `__shared__`, ...) with
//! calls into hip-emu's executor. The result is one shared object per source: every
//! `__global__` function the source defines ([`kernel_symbols`]: C++ kernels under their
//! mangled symbol, templates as instantiated in the file, overloads apart, `extern "C"` ones
//! under their name) gets a trampoline and its parameter sizes (deduced from its C++ type),
//! and the object exports one entry point,
//! `hipemu_module_init` (`shim/hipemu_registry.h`). No list of kernel names is kept anywhere.
//!
//! [`install`] then names a copy after the [`host key`](hip_codeobj::emu::host_key) of the
//! code object hipcc built from the same source. At `hipModuleLoadData`, hip-emu computes the
//! same key from the image and loads `<key>.so` from its search path (hip-emu's README: the
//! `OUT_DIR`s of the running program's Cargo target directory, `HIPK_EMU_KERNELS`). So any
//! crate's kernels run on hip-emu, with the same checks as hip-kernels' own.
//!
//! [`crate::Builder::build`] does all of this for every source it compiles with hipcc, when a
//! clang++ >= 15 is found ([`ENV_VARS`] control it). Compiles are cached by content (the
//! preprocessed source, the flags, the compiler and the shim): a rebuild with the same inputs
//! copies the cached object.

use hip_codeobj::emu::{fnv1a64, host_key, KeyError};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Environment variables of the host build (each a `rerun-if-env-changed` of a [`crate::Builder`]):
/// `HIPK_EMU_CXX` (the clang++ to use), `HIPK_EMU_HOST_BUILD` (`0`: no host build; `1`: a
/// missing compiler or a failed host compile is a build error instead of a warning),
/// `HIPK_EMU_RACE_CHECK` (`1`: instrument the kernels for hip-emu's LDS race check, about 2×
/// slower kernels), `HIPK_EMU_NO_FMA` (`1`: no `-mfma`).
pub const ENV_VARS: &[&str] = &[
    "HIPK_EMU_CXX",
    "HIPK_EMU_HOST_BUILD",
    "HIPK_EMU_RACE_CHECK",
    "HIPK_EMU_NO_FMA",
];

/// The shim, as `(relative path, text)`: written next to each host build (it ships inside this
/// crate, so a downstream build needs nothing from hip-emu's sources).
pub const SHIM_FILES: &[(&str, &str)] = &[
    (
        "hip/hip_runtime.h",
        include_str!("../shim/hip/hip_runtime.h"),
    ),
    ("hip/hip_fp16.h", include_str!("../shim/hip/hip_fp16.h")),
    ("hip/hipemu_mma.h", include_str!("../shim/hip/hipemu_mma.h")),
    (
        "hip/hipemu_device_functions.h",
        include_str!("../shim/hip/hipemu_device_functions.h"),
    ),
    (
        "hip/hip_cooperative_groups.h",
        include_str!("../shim/hip/hip_cooperative_groups.h"),
    ),
    (
        "hip/hipemu_vector_types.h",
        include_str!("../shim/hip/hipemu_vector_types.h"),
    ),
    (
        "hipemu_registry.h",
        include_str!("../shim/hipemu_registry.h"),
    ),
    ("hipemu_state.cpp", include_str!("../shim/hipemu_state.cpp")),
    ("hipemu_race.cpp", include_str!("../shim/hipemu_race.cpp")),
    ("hipemu_asan.cpp", include_str!("../shim/hipemu_asan.cpp")),
];

/// The overrun check's instrumentation (shim/hipemu_asan.cpp): AddressSanitizer's checks before
/// every load and store, reporting without stopping, against the shadow hip-emu maps (its
/// offset in a variable), with no ASan runtime: no stack, global or use-after-scope checks,
/// which would need one.
pub const ASAN_FLAGS: &[&str] = &[
    "-fsanitize=address",
    "-fsanitize-recover=address",
    "-fno-sanitize-address-use-after-scope",
    "-mllvm",
    "-asan-stack=0",
    "-mllvm",
    "-asan-globals=0",
    "-mllvm",
    "-asan-force-dynamic-shadow=1",
    "-mllvm",
    "-asan-instrumentation-with-call-threshold=100000",
];

/// Flags of every host compile, besides include dirs, `-mfma` and the race instrumentation.
pub const HOST_FLAGS: &[&str] = &[
    "-std=c++17",
    "-O2",
    // Line tables: the race check reports kernel source lines.
    "-g1",
    "-fPIC",
    "-fvisibility=hidden",
    "-fno-exceptions",
    "-fno-rtti",
    "-fno-strict-aliasing",
    // Frames over a page probe every page, so a fibre's stack overflow always lands on its
    // guard page.
    "-fstack-clash-protection",
    "-Wno-pass-failed",
    "-Wno-unknown-pragmas",
    // What hipcc defines for a gfx906 device compile (the AMD path is the one tested), so that
    // code testing them before it includes <hip/hip_runtime.h> sees them too.
    "-D__HIP_PLATFORM_AMD__=1",
    "-D__HIP_PLATFORM_HCC__=1",
    "-D__HIP__=1",
    "-D__HIPCC__=1",
    "-D__gfx906__=1",
    "-D__AMDGCN_WAVEFRONT_SIZE=64",
    "-DHIPEMU=1",
];

/// Why a host build failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// No usable clang++.
    #[error("no clang++ >= 15 found (tried {tried}); install clang-15 (Debian: apt-get install clang-15) or set HIPK_EMU_CXX")]
    NoCompiler {
        /// The names tried.
        tried: String,
    },
    /// `HIPK_EMU_CXX` names something that is not a clang++ >= 15.
    #[error("HIPK_EMU_CXX={cxx} is {what}; set it to a clang++ >= 15")]
    BadCompiler {
        /// The value.
        cxx: String,
        /// What it is instead.
        what: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The compiler failed.
    #[error("the host build of {source_file} failed (a HIP builtin hip-emu's shim lacks?)\ncommand: {command}\nstderr:\n{stderr}")]
    Compile {
        /// The kernel source.
        source_file: PathBuf,
        /// The command line.
        command: String,
        /// What the compiler printed.
        stderr: String,
    },
    /// The code object given to [`install`] has no key.
    #[error("no host key for this image: {0}")]
    Key(#[from] KeyError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HostError + '_ {
    move |source| HostError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A clang++ >= 15 for host builds.
#[derive(Clone, Debug)]
pub struct HostCompiler {
    cxx: PathBuf,
    version: String,
}

/// How to compile: see the field docs; [`HostOptions::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct HostOptions {
    /// Where compiled objects are cached, by content.
    pub cache_dir: PathBuf,
    /// More include directories (the source's own directory is always on the path).
    pub include_dirs: Vec<PathBuf>,
    /// `__FILE__` and race reports name sources relative to this directory.
    pub source_root: Option<PathBuf>,
    /// Instrument the kernels for hip-emu's LDS race check.
    pub race: bool,
    /// Use FMA instructions for `fmaf` (else a correctly rounded libm call: same results).
    pub fma: bool,
}

impl HostOptions {
    /// Cache in `cache_dir`; race check from `HIPK_EMU_RACE_CHECK=1`; FMA when this machine
    /// has it, builds for itself (build scripts: `HOST` = `TARGET`) and `HIPK_EMU_NO_FMA` is
    /// not `1`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> HostOptions {
        let var_is_1 = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
        let cross = std::env::var("HOST").ok() != std::env::var("TARGET").ok();
        HostOptions {
            cache_dir: cache_dir.into(),
            include_dirs: Vec::new(),
            source_root: None,
            race: var_is_1("HIPK_EMU_RACE_CHECK"),
            fma: !var_is_1("HIPK_EMU_NO_FMA") && !cross && host_has_fma(),
        }
    }
}

fn host_has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One compiled source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostObject {
    /// The shared object (in the cache directory).
    pub path: PathBuf,
    /// Its kernels, in source order.
    pub kernels: Vec<String>,
    /// Its `__device__` and `__constant__` variables (symbols), in source order.
    pub globals: Vec<String>,
}

impl HostCompiler {
    /// `HIPK_EMU_CXX` if set, else the first clang++ >= 15 among `clang++`, `clang++-20` ..
    /// `clang++-15` and `/usr/lib/llvm-<v>/bin/clang++`.
    pub fn find() -> Result<HostCompiler, HostError> {
        if let Some(cxx) = std::env::var_os("HIPK_EMU_CXX").filter(|v| !v.is_empty()) {
            let p = PathBuf::from(&cxx);
            return match clang_version(&p) {
                Some((v, text)) if v >= 15 => Ok(HostCompiler {
                    cxx: p,
                    version: text,
                }),
                Some((v, _)) => Err(HostError::BadCompiler {
                    cxx: p.display().to_string(),
                    what: format!("clang {v}"),
                }),
                None => Err(HostError::BadCompiler {
                    cxx: p.display().to_string(),
                    what: "not a runnable clang++".into(),
                }),
            };
        }
        let mut candidates = vec![PathBuf::from("clang++")];
        for v in (15..=20).rev() {
            candidates.push(PathBuf::from(format!("clang++-{v}")));
            candidates.push(PathBuf::from(format!("/usr/lib/llvm-{v}/bin/clang++")));
        }
        for c in &candidates {
            if let Some((v, text)) = clang_version(c) {
                if v >= 15 {
                    return Ok(HostCompiler {
                        cxx: c.clone(),
                        version: text,
                    });
                }
            }
        }
        Err(HostError::NoCompiler {
            tried: "clang++, clang++-20..15, /usr/lib/llvm-*/bin/clang++".into(),
        })
    }

    /// The compiler's path.
    pub fn path(&self) -> &Path {
        &self.cxx
    }

    /// Compiles `src` (or returns the cached object of identical inputs).
    pub fn compile(&self, src: &Path, opts: &HostOptions) -> Result<HostObject, HostError> {
        fs::create_dir_all(&opts.cache_dir).map_err(io(&opts.cache_dir))?;
        let shim = write_shim(&opts.cache_dir)?;
        let text = fs::read_to_string(src).map_err(io(src))?;
        let src_dir = src.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut flags: Vec<String> = HOST_FLAGS.iter().map(|s| s.to_string()).collect();
        if opts.fma {
            flags.push("-mfma".into());
        }
        if let Some(root) = &opts.source_root {
            flags.push(format!("-fmacro-prefix-map={}/=", root.display()));
        }
        for dir in [&shim, &src_dir].into_iter().chain(&opts.include_dirs) {
            flags.push("-I".into());
            flags.push(dir.display().to_string());
        }
        // `extern __shared__ T name[];` cannot be a macro: compile a rewritten copy (same line
        // count; #line keeps the kernel's own file name in every message).
        let stem = src
            .file_stem()
            .map_or("kernels".into(), |s| s.to_string_lossy());
        let input = if text.contains("extern __shared__") {
            let copy = opts
                .cache_dir
                .join(format!("{stem}-{:016x}.hip", fnv1a64(text.as_bytes())));
            let rewritten = format!(
                "#line 1 \"{}\"\n{}",
                src.display(),
                rewrite_extern_shared(&text)
            );
            write_if_changed(&copy, &rewritten)?;
            copy
        } else {
            src.to_path_buf()
        };
        let pre = self.run(
            src,
            Command::new(&self.cxx)
                .args(["-x", "c++", "-E"])
                .args(&flags)
                .arg(&input),
        )?;
        // `tu 2`: the generated translation unit's form (2: the source's declarations exported).
        let mut key_text = format!(
            "abi 2\ntu 2\n{}\n{}\n{}\n",
            self.cxx.display(),
            self.version,
            opts.race
        );
        for f in flags
            .iter()
            .map(String::as_str)
            .chain(ASAN_FLAGS.iter().copied())
        {
            let _ = writeln!(key_text, "{f}");
        }
        for (name, t) in SHIM_FILES {
            let _ = writeln!(key_text, "{name} {:016x}", fnv1a64(t.as_bytes()));
        }
        key_text.push_str(&pre);
        let key = format!("{:016x}", fnv1a64(key_text.as_bytes()));
        let out = opts.cache_dir.join(format!("{stem}-{key}.so"));
        let list = opts.cache_dir.join(format!("{stem}-{key}.kernels"));
        if out.is_file() {
            if let Ok(text) = fs::read_to_string(&list) {
                let (kernels, globals) = split_list(&text);
                return Ok(HostObject {
                    path: out,
                    kernels,
                    globals,
                });
            }
        }
        // Which `__global__` functions the source defines, under the symbols the code object
        // gives them: the shim puts every kernel in one section, and a quick unoptimised
        // compile to LLVM IR lists the functions defined there (templates only where
        // instantiated, explicitly or by a launch in the file, as on the device).
        let ir = self.run(
            src,
            Command::new(&self.cxx)
                .args(["-x", "c++"])
                .args(&flags)
                .args(["-O0", "-g0", "-S", "-emit-llvm", "-o", "-"])
                .arg(&input),
        )?;
        let kernels = kernel_symbols(&ir);
        let globals = global_symbols(&ir);
        let tu_text =
            render_tu(&input, &kernels, &globals, opts).map_err(|e| HostError::Compile {
                source_file: src.to_path_buf(),
                command: "demangling the kernel symbols".into(),
                stderr: e,
            })?;

        // Unique per process and call: concurrent builds of the same key each get their own.
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let work = opts
            .cache_dir
            .join(format!("work-{stem}-{key}-{}-{call}", std::process::id()));
        fs::create_dir_all(&work).map_err(io(&work))?;
        let tu = work.join("module.cpp");
        write_if_changed(&tu, &tu_text)?;
        let support = [
            shim.join("hipemu_state.cpp"),
            shim.join("hipemu_race.cpp"),
            shim.join("hipemu_asan.cpp"),
        ];
        let tmp = work.join("module.so");
        let result = (|| {
            let mut link = Command::new(&self.cxx);
            link.args(&flags).arg("-shared").arg("-o").arg(&tmp);
            // The kernels are instrumented (the race check's or the overrun check's); the shim
            // is not. The two sanitizers cannot share a compile: race builds check the overrun
            // shadow from their own callbacks (shim/hipemu_asan.cpp).
            let obj = work.join("module.o");
            let instrument: &[&str] = if opts.race {
                &["-fsanitize=thread", "-DHIPEMU_RACE_CHECK=1"]
            } else {
                ASAN_FLAGS
            };
            self.run(
                src,
                Command::new(&self.cxx)
                    .args(&flags)
                    .args(instrument)
                    .arg("-c")
                    .arg(&tu)
                    .arg("-o")
                    .arg(&obj),
            )?;
            link.arg(&obj);
            self.run(src, link.args(&support))?;
            write_if_changed(&list, &join_list(&kernels, &globals))?;
            fs::rename(&tmp, &out).map_err(io(&out))
        })();
        let _ = fs::remove_dir_all(&work);
        result.map(|()| HostObject {
            path: out,
            kernels,
            globals,
        })
    }

    fn run(&self, src: &Path, cmd: &mut Command) -> Result<String, HostError> {
        let output = cmd.output().map_err(io(&self.cxx))?;
        if !output.status.success() {
            return Err(HostError::Compile {
                source_file: src.to_path_buf(),
                command: format!("{cmd:?}"),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// Copies `object` to `<dir>/<key>.so`, `key` being the host key of `image` (the bundle or code
/// object hipcc built from the same source): the name hip-emu looks for when it loads `image`.
pub fn install(object: &Path, image: &[u8], dir: &Path) -> Result<PathBuf, HostError> {
    let key = host_key(image)?;
    fs::create_dir_all(dir).map_err(io(dir))?;
    let dest = dir.join(format!("{key}.so"));
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{key}.so.{}-{call}", std::process::id()));
    fs::copy(object, &tmp).map_err(io(object))?;
    fs::rename(&tmp, &dest).map_err(io(&dest))?;
    Ok(dest)
}

/// Writes the shim into `<dir>/shim-<hash>/` (once per shim version) and returns that directory.
fn write_shim(dir: &Path) -> Result<PathBuf, HostError> {
    let mut all = String::new();
    for (name, text) in SHIM_FILES {
        let _ = write!(all, "{name}\n{text}");
    }
    let shim = dir.join(format!("shim-{:016x}", fnv1a64(all.as_bytes())));
    for (name, text) in SHIM_FILES {
        let path = shim.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        write_if_changed(&path, text)?;
    }
    Ok(shim)
}

/// Writes `text` unless the file holds it already; through a temporary file and a rename, so
/// a concurrent build never reads a half-written file.
fn write_if_changed(path: &Path, text: &str) -> Result<(), HostError> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let mut tmp = path.as_os_str().to_owned();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    tmp.push(format!(".tmp{}-{call}", std::process::id()));
    fs::write(&tmp, text).map_err(io(path))?;
    fs::rename(&tmp, path).map_err(io(path))
}

/// The generated translation unit: the source (its declarations of default visibility), one `HIPEMU_ENTRY` per kernel, the module table.
/// A C++ kernel (a mangled symbol) is reached through a declaration with its parameter list
/// (from the demangled symbol) bound to the symbol by an asm label, so templates, overloads and
/// namespaces need no name lookup; an `extern "C"` kernel is named directly. Err: a symbol
/// that does not demangle to a parameter list.
fn render_tu(
    input: &Path,
    kernels: &[String],
    globals: &[String],
    opts: &HostOptions,
) -> Result<String, String> {
    let mut tu = String::from("// Generated by hip-build's host build for hip-emu: do not edit.\n");
    // The file's static __shared__ variables live in their own section (its bounds are the
    // linker's __start_/__stop_ symbols, weak: a file without __shared__ has none).
    tu.push_str("#define HIPEMU_LDS_SECTION \"hipemu_lds_0\"\n");
    // The source's own declarations get default visibility (the shim's, included first, stay
    // hidden): its `__device__` / `__constant__` variables are then `dlsym`-able in the shared
    // object, which is how a client names one to hip-emu's hipMemcpyToSymbol & co.
    tu.push_str("#include <hip/hip_runtime.h>\n#pragma GCC visibility push(default)\n");
    let _ = writeln!(tu, "#include \"{}\"", input.display());
    tu.push_str("#pragma GCC visibility pop\n");
    for (edge, macro_name) in [("start", "HIPEMU_LDS_BEGIN"), ("stop", "HIPEMU_LDS_END")] {
        let _ = writeln!(
            tu,
            "extern \"C\" char __{edge}_hipemu_lds_0[] __attribute__((weak, visibility(\"hidden\")));\n\
             #define {macro_name} __{edge}_hipemu_lds_0"
        );
    }
    tu.push_str("#include \"hipemu_registry.h\"\n");
    for (i, k) in kernels.iter().enumerate() {
        if crate::names::is_identifier(k) && !k.starts_with("_Z") {
            let _ = writeln!(tu, "HIPEMU_ENTRY({i}, {k}, {k:?})");
        } else {
            let params = demangled_params(k)?;
            let _ = writeln!(
                tu,
                "void hipemu_kernel_{i}({params}) __asm__({k:?});\nHIPEMU_ENTRY({i}, hipemu_kernel_{i}, {k:?})"
            );
        }
    }
    tu.push_str("static const hipemu_entry* const hipemu_entries[] = {\n");
    for i in 0..kernels.len() {
        let _ = writeln!(tu, "  &hipemu_entry_{i},");
    }
    tu.push_str("  nullptr};\n");
    for (i, g) in globals.iter().enumerate() {
        let name = if g.starts_with("_Z") {
            hip_codeobj::demangle::demangle_name(g)
                .ok_or_else(|| format!("variable symbol `{g}` does not demangle"))?
        } else {
            g.clone()
        };
        let _ = writeln!(tu, "HIPEMU_GLOBAL({i}, {name}, {g:?})");
    }
    tu.push_str("static const hipemu_global* const hipemu_globals[] = {\n");
    for i in 0..globals.len() {
        let _ = writeln!(tu, "  &hipemu_global_{i},");
    }
    tu.push_str("  nullptr};\n");
    let root = opts
        .source_root
        .as_ref()
        .map(|r| format!("{}/", r.display()))
        .unwrap_or_default();
    let _ = writeln!(
        tu,
        "HIPEMU_MODULE(hipemu_entries, {}, {}, {root:?}, hipemu_globals, {})",
        kernels.len(),
        u32::from(opts.race),
        globals.len()
    );
    Ok(tu)
}

/// The parameter list of a mangled C++ function symbol, as C++ source (`float, float const*`).
pub fn demangled_params(symbol: &str) -> Result<String, String> {
    let d = hip_codeobj::demangle::demangle(symbol).ok_or_else(|| {
        format!("kernel symbol `{symbol}` does not demangle (not an Itanium C++ name)")
    })?;
    if d.params.contains("(anonymous namespace)") || d.params.contains("{lambda") {
        return Err(format!(
            "kernel `{}`: a parameter type has no name outside its file (an anonymous namespace \
             or a lambda); give it a named namespace",
            d.full()
        ));
    }
    Ok(d.params)
}

/// `clang version N...` of `cxx --version`: (N, first line).
fn clang_version(cxx: &Path) -> Option<(u32, String)> {
    let out = Command::new(cxx).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = &text[text.find("clang version ")? + "clang version ".len()..];
    let major = rest.split('.').next()?.trim().parse().ok()?;
    Some((major, text.lines().next().unwrap_or("").to_string()))
}

/// The symbols of the functions LLVM IR `ir` defines in the shim's kernel section
/// (`hipemu_kernels`, where `__global__` puts them), in order, once each; internal ones
/// (`static`, anonymous namespaces) are left out: the code object exports no such kernel.
pub fn kernel_symbols(ir: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in ir.lines() {
        let Some(rest) = line.strip_prefix("define ") else {
            continue;
        };
        if !line.contains("section \"hipemu_kernels\"") {
            continue;
        }
        let Some(at) = rest.find('@') else { continue };
        let head = &rest[..at];
        if head.contains("internal ") || head.contains("private ") {
            continue;
        }
        let sym = &rest[at + 1..];
        let name = match sym.strip_prefix('"') {
            Some(quoted) => quoted.split('"').next().unwrap_or(""),
            None => sym.split('(').next().unwrap_or(""),
        };
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// The symbols of the variables LLVM IR `ir` defines with external linkage: the source's
/// `__device__` and `__constant__` variables (the host build compiles device code only, so a
/// namespace-scope variable of a kernel file is the device's). Left out: internal ones
/// (`static`, `const` at namespace scope, `__shared__`), template and inline variables, the
/// compiler's own (`llvm.`, guard variables, type info) and the shim's (`hipemu`, `__`).
pub fn global_symbols(ir: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in ir.lines() {
        let Some(rest) = line.strip_prefix('@') else {
            continue;
        };
        let Some((name, def)) = rest.split_once(" = ") else {
            continue;
        };
        let words: Vec<&str> = def
            .split_whitespace()
            .take_while(|w| *w != "global" && *w != "constant")
            .collect();
        let kind = def.split_whitespace().nth(words.len());
        if !matches!(kind, Some("global" | "constant")) {
            continue;
        }
        let excluded_linkage = [
            "internal",
            "private",
            "external",
            "extern_weak",
            "linkonce",
            "linkonce_odr",
            "weak",
            "weak_odr",
            "available_externally",
            "common",
            "appending",
        ];
        if words.iter().any(|w| excluded_linkage.contains(w)) {
            continue;
        }
        let name = name.trim_matches('"');
        let compiler_own = [
            "llvm.", "__", "hipemu", "_ZTV", "_ZTI", "_ZTS", "_ZGV", "_ZZ", ".",
        ];
        if name.is_empty() || compiler_own.iter().any(|p| name.starts_with(p)) {
            continue;
        }
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    names
}

/// The cached symbol list: kernels, a `--globals` line, globals.
fn join_list(kernels: &[String], globals: &[String]) -> String {
    let mut text = kernels.join("\n");
    text.push_str("\n--globals\n");
    text.push_str(&globals.join("\n"));
    text
}

fn split_list(text: &str) -> (Vec<String>, Vec<String>) {
    let (k, g) = text.split_once("--globals").unwrap_or((text, ""));
    let lines = |t: &str| -> Vec<String> {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    };
    (lines(k), lines(g))
}

/// `extern __shared__ <type> <name>[];` -> `HIPEMU_EXTERN_SHARED(<type>, <name>);` on the same
/// line (the dynamic LDS buffer of the launch).
pub fn rewrite_extern_shared(text: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extern_shared_becomes_the_dynamic_buffer_on_the_same_line() {
        let src = "a\nextern __shared__ __align__(16) float smem[];\nb";
        assert_eq!(
            rewrite_extern_shared(src),
            "a\nHIPEMU_EXTERN_SHARED(float, smem);\nb"
        );
        assert_eq!(rewrite_extern_shared("no shared"), "no shared");
    }

    #[test]
    fn kernel_symbols_are_the_definitions_in_the_kernel_section() {
        let ir = "define weak_odr hidden void @_Z2mmILj16EEvPKfPfi(ptr %0) #0 section \"hipemu_kernels\" comdat {\n\
                  define hidden void @helper(ptr %0) #1 {\n\
                  define internal void @_ZL6hiddenPf(ptr %0) #0 section \"hipemu_kernels\" {\n\
                  define hidden void @k_f32(ptr %0) #0 section \"hipemu_kernels\" {\n\
                  declare void @_Z2mmILj16EEvPKfPfi(ptr)\n";
        assert_eq!(kernel_symbols(ir), ["_Z2mmILj16EEvPKfPfi", "k_f32"]);
    }

    #[test]
    fn globals_are_the_external_variables_of_the_source() {
        let ir = "@counter = dso_local global i32 0, align 4\n\
                  @_ZN2ns5tableE = hidden global [5 x float] zeroinitializer, align 16\n\
                  @_ZL5local = internal global i32 0, align 4\n\
                  @_ZZ1kPfE4tile = internal global [64 x float] zeroinitializer, section \"hipemu_lds_0\"\n\
                  @hipemu_state = external global %struct.hipemu_state_t, align 8\n\
                  @_ZTV3Foo = linkonce_odr dso_local unnamed_addr constant { [3 x ptr] } zeroinitializer\n\
                  @llvm.global.annotations = appending global [1 x { ptr }] zeroinitializer\n\
                  @mask = dso_local constant [3 x float] zeroinitializer, align 4\n";
        assert_eq!(global_symbols(ir), ["counter", "_ZN2ns5tableE", "mask"]);
        let text = join_list(&["k".into()], &["counter".into()]);
        assert_eq!(
            split_list(&text),
            (vec!["k".into()], vec!["counter".into()])
        );
        assert_eq!(split_list(&join_list(&[], &[])), (vec![], vec![]));
    }

    #[test]
    fn trampolines_take_the_parameter_list_of_the_demangled_symbol() {
        assert_eq!(
            demangled_params("_Z2mmILj16EEvPKfPfi").unwrap(),
            "float const*, float*, int"
        );
        assert_eq!(
            demangled_params("_Z12saxpy_kernelfPK15HIP_vector_typeIfLj4EEPf").unwrap(),
            "float, HIP_vector_type<float, 4u> const*, float*"
        );
        assert_eq!(demangled_params("_Z1kv").unwrap(), "");
        assert_eq!(demangled_params("_Z1kPFviE").unwrap(), "void (*)(int)");
        let e = demangled_params("not_mangled").unwrap_err();
        assert!(e.contains("not_mangled"), "{e}");
        let e = demangled_params("_Z1kN12_GLOBAL__N_11SE").unwrap_err();
        assert!(e.contains("anonymous namespace"), "{e}");
    }

    /// Every file under shim/ ships: a header missing from SHIM_FILES fails a downstream host
    /// build with "file not found" (as hipemu_mma.h once did).
    #[test]
    fn every_shim_file_is_in_shim_files() {
        fn walk(dir: &std::path::Path, root: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).expect("shim/ is readable") {
                let p = e.expect("a shim/ entry").path();
                if p.is_dir() {
                    walk(&p, root, out);
                } else {
                    let rel = p.strip_prefix(root).expect("below shim/");
                    out.push(rel.to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shim");
        let mut on_disk = Vec::new();
        walk(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut listed: Vec<String> = SHIM_FILES.iter().map(|(p, _)| p.to_string()).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }
}
