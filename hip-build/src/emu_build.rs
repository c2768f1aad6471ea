//! The [`crate::Builder`]'s host build for hip-emu: after hipcc built a source's bundle, the same
//! source is compiled for the host ([`crate::host`]) and installed as `$OUT_DIR/hipemu/<key>.so`,
//! where hip-emu finds it when a program loads that bundle.

use crate::host::{self, HostCompiler, HostOptions};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The directory under `OUT_DIR` that holds the host builds (hip-emu searches
/// `<target>/<profile>/build/*/out/hipemu/`).
pub const HOST_DIR: &str = "hipemu";

/// What the host build does in this build script.
pub(crate) enum Plan {
    /// `HIPK_EMU_HOST_BUILD=0`.
    Off,
    /// No compiler: each bundle gets `<key>.missing` with the reason, read by hip-emu.
    Missing(String),
    On {
        cxx: HostCompiler,
        opts: HostOptions,
        required: bool,
    },
}

/// Per-build state: the plan and what was installed (to prune stale files).
pub(crate) struct EmuBuild {
    crate_name: String,
    plan: Plan,
    dir: PathBuf,
    written: Mutex<BTreeSet<String>>,
    failures: Mutex<Vec<String>>,
}

impl EmuBuild {
    pub fn new(crate_name: &str, out_dir: &Path, source_root: &Path, includes: &[PathBuf]) -> Self {
        for var in host::ENV_VARS {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let mode = std::env::var("HIPK_EMU_HOST_BUILD").unwrap_or_default();
        let required = mode == "1";
        let plan = if mode == "0" {
            Plan::Off
        } else {
            match HostCompiler::find() {
                Ok(cxx) => {
                    let mut opts = HostOptions::new(crate::cache::root(out_dir).join("hipemu"));
                    opts.source_root = Some(source_root.to_path_buf());
                    opts.include_dirs = includes.to_vec();
                    Plan::On {
                        cxx,
                        opts,
                        required,
                    }
                }
                Err(e) if required => {
                    panic!("{crate_name}: HIPK_EMU_HOST_BUILD=1 but {e}")
                }
                Err(e) => Plan::Missing(format!(
                    "{crate_name}'s build found {e}, so its kernels were not compiled for \
                     hip-emu; rebuild after installing one"
                )),
            }
        };
        EmuBuild {
            crate_name: crate_name.to_string(),
            plan,
            dir: out_dir.join(HOST_DIR),
            written: Mutex::new(BTreeSet::new()),
            failures: Mutex::new(Vec::new()),
        }
    }

    /// The host build of `src`, whose bundle hipcc wrote to `bundle`. A failure is recorded
    /// (`<key>.missing`, a summary warning) or, with `HIPK_EMU_HOST_BUILD=1`, a panic.
    pub fn add(&self, src: &Path, bundle: &Path) {
        let reason = match &self.plan {
            Plan::Off => return,
            Plan::Missing(reason) => reason.clone(),
            Plan::On {
                cxx,
                opts,
                required,
            } => match self.build_one(cxx, opts, src, bundle) {
                Ok(()) => return,
                Err(e) if *required => panic!("{}: HIPK_EMU_HOST_BUILD=1: {e}", self.crate_name),
                Err(e) => {
                    let first = e.to_string().lines().next().unwrap_or("").to_string();
                    if let Ok(mut f) = self.failures.lock() {
                        f.push(format!("{}: {first}", src.display()));
                    }
                    e.to_string()
                }
            },
        };
        // Without a key there is nothing hip-emu could match: the reason goes nowhere.
        let Ok(bytes) = fs::read(bundle) else { return };
        let Ok(key) = hip_codeobj::emu::host_key(&bytes) else {
            return;
        };
        let file = format!("{key}.missing");
        if fs::create_dir_all(&self.dir).is_ok()
            && fs::write(
                self.dir.join(&file),
                format!("{}: {reason}\n", src.display()),
            )
            .is_ok()
        {
            if let Ok(mut w) = self.written.lock() {
                w.insert(file);
            }
        }
    }

    fn build_one(
        &self,
        cxx: &HostCompiler,
        opts: &HostOptions,
        src: &Path,
        bundle: &Path,
    ) -> Result<(), host::HostError> {
        let object = cxx.compile(src, opts)?;
        let image = fs::read(bundle).map_err(|source| host::HostError::Io {
            path: bundle.to_path_buf(),
            source,
        })?;
        let dest = host::install(&object.path, &image, &self.dir)?;
        if let (Ok(mut w), Some(name)) = (self.written.lock(), dest.file_name()) {
            w.insert(name.to_string_lossy().into_owned());
        }
        Ok(())
    }

    /// Removes what earlier builds installed and this one did not, and prints one warning for
    /// every failed host build together.
    pub fn finish(self) {
        let written = self.written.into_inner().unwrap_or_else(|e| e.into_inner());
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !written.contains(&name) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        let failures = self
            .failures
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        if !failures.is_empty() {
            println!(
                "cargo:warning={}: {} kernel source(s) not compiled for hip-emu (they still run \
                 on a GPU): {}; HIPK_EMU_HOST_BUILD=1 makes this an error with the full output",
                self.crate_name,
                failures.len(),
                failures.join("; ")
            );
        }
    }
}
