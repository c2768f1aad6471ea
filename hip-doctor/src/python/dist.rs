//! What pip installed, read from disk without importing anything: `*.dist-info/METADATA`
//! (name, version, `Requires-Dist`), `RECORD` (the files, the shared libraries among them) and
//! `torch/version.py`.
//!
//! Every file is read with a size cap ([`read_capped`]); a file over it is cut there.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The packages a fine-tune uses, by normalised name (PEP 503: lower case, `-`).
pub const WATCHED: [&str; 14] = [
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "deepspeed",
    "flash-attn",
    "xformers",
    "bitsandbytes",
    "apex",
    "vllm",
    "transformers",
    "peft",
    "accelerate",
    "llamafactory",
];

/// The most bytes read of a METADATA or version.py file.
const TEXT_LIMIT: u64 = 4 << 20;
/// The most bytes read of a RECORD (torch's is about 2 MB).
const RECORD_LIMIT: u64 = 32 << 20;
/// The most site-packages entries looked at in one directory.
const DIR_LIMIT: usize = 100_000;

/// The normalised form of a distribution name (PEP 503).
pub fn normalise(name: &str) -> String {
    let mut out = String::new();
    for c in name.trim().chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// One installed distribution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dist {
    /// The name as METADATA spells it.
    pub name: String,
    /// Its normalised name.
    pub key: String,
    /// The version METADATA states.
    pub version: String,
    /// Every `Requires-Dist` line.
    pub requires: Vec<String>,
    /// The shared libraries RECORD lists, as paths under the site-packages directory.
    pub libraries: Vec<PathBuf>,
    /// The site-packages directory it lives in.
    pub site: PathBuf,
    /// Its `.dist-info` directory.
    pub dist_info: PathBuf,
}

/// Reads at most `limit` bytes of a file as text (lossily).
pub fn read_capped(path: &Path, limit: u64) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit)
        .read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The fields of a METADATA file (RFC 822 style headers, up to the first blank line).
pub fn parse_metadata(text: &str) -> (Option<String>, Option<String>, Vec<String>) {
    let (mut name, mut version, mut requires) = (None, None, Vec::new());
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim().to_string();
        match key.to_ascii_lowercase().as_str() {
            "name" => name = Some(value),
            "version" => version = Some(value),
            "requires-dist" => requires.push(value),
            _ => {}
        }
    }
    (name, version, requires)
}

/// The shared libraries a RECORD lists (`path,hash,size` lines; paths relative to the
/// site-packages directory). Paths that climb out of it (`../../bin/x`) are left out.
pub fn record_libraries(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            // A path with a comma is quoted (csv); shared library paths never are in practice.
            let path = line.split(',').next()?.trim_matches('"');
            let file = Path::new(path).file_name()?.to_str()?;
            let is_library = file.ends_with(".so") || file.contains(".so.");
            (is_library && !path.starts_with("..") && !path.starts_with('/'))
                .then(|| PathBuf::from(path))
        })
        .collect()
}

/// The watched distributions installed in `sites`, in the order of the sites (the first
/// wins for a name installed twice, as Python's import does); and one line per site that could
/// not be read.
pub fn scan(sites: &[PathBuf]) -> (Vec<Dist>, Vec<String>) {
    let mut found: Vec<Dist> = Vec::new();
    let mut problems = Vec::new();
    for site in sites {
        let entries = match std::fs::read_dir(site) {
            Ok(entries) => entries,
            Err(e) => {
                problems.push(format!("{}: {e}", site.display()));
                continue;
            }
        };
        let mut infos: Vec<PathBuf> = entries
            .take(DIR_LIMIT)
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "dist-info"))
            .collect();
        infos.sort();
        for info in infos {
            let Some(dist) = read_dist(site, &info) else {
                continue;
            };
            if WATCHED.contains(&dist.key.as_str()) && !found.iter().any(|d| d.key == dist.key) {
                found.push(dist);
            }
        }
    }
    (found, problems)
}

/// Reads one `.dist-info` directory; `None` when it has no readable METADATA with a name.
fn read_dist(site: &Path, info: &Path) -> Option<Dist> {
    // Cheap filter first: the directory's name starts with the distribution's name.
    let stem = info.file_name()?.to_str()?.split('-').next()?.to_string();
    if !WATCHED.contains(&normalise(&stem).as_str()) {
        return None;
    }
    let metadata = read_capped(&info.join("METADATA"), TEXT_LIMIT).ok()?;
    let (name, version, requires) = parse_metadata(&metadata);
    let name = name?;
    let record = read_capped(&info.join("RECORD"), RECORD_LIMIT).unwrap_or_default();
    Some(Dist {
        key: normalise(&name),
        name,
        version: version.unwrap_or_default(),
        requires,
        libraries: record_libraries(&record),
        site: site.to_path_buf(),
        dist_info: info.to_path_buf(),
    })
}

/// The fields of `torch/version.py` (written by PyTorch's `tools/generate_torch_version.py`:
/// `__version__`, `debug`, `cuda`, `git_version`, `hip`; newer releases add `rocm` and `xpu`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TorchVersionPy {
    /// `__version__`, e.g. `2.4.1+das.opt2.dtk2504`.
    pub version: Option<String>,
    /// `cuda`: the CUDA version, `None` when the line says `None`.
    pub cuda: Option<String>,
    /// `hip`: the HIP version of a ROCm/DTK build, e.g. `6.2.41133-dd7f95766`.
    pub hip: Option<String>,
    /// `rocm` (newer releases).
    pub rocm: Option<String>,
}

/// Parses the assignments of `version.py` without running it. A value is a quoted string or
/// `None`; the `name: Optional[str] = value` form is accepted too.
pub fn parse_version_py(text: &str) -> TorchVersionPy {
    let mut out = TorchVersionPy::default();
    for line in text.lines() {
        let Some((left, value)) = line.split_once('=') else {
            continue;
        };
        let name = left.split(':').next().unwrap_or("").trim();
        let value = value.trim();
        let string = (value.len() >= 2
            && (value.starts_with('\'') || value.starts_with('"'))
            && value.ends_with(&value[..1]))
        .then(|| value[1..value.len() - 1].to_string());
        match name {
            "__version__" => out.version = string,
            "cuda" => out.cuda = string,
            "hip" => out.hip = string,
            "rocm" => out.rocm = string,
            _ => {}
        }
    }
    out
}

/// Reads `torch/version.py` from the site-packages directory of `torch`.
pub fn torch_version_py(torch: &Dist) -> Result<TorchVersionPy, String> {
    let path = torch.site.join("torch/version.py");
    read_capped(&path, TEXT_LIMIT)
        .map(|text| parse_version_py(&text))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The site-packages directories in a `sys.path`: the entries named `site-packages` or
/// `dist-packages` that exist.
pub fn site_dirs(sys_path: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for p in sys_path {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if matches!(name, "site-packages" | "dist-packages") && p.is_dir() && !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise() {
        assert_eq!(normalise("Flash_Attn"), "flash-attn");
        assert_eq!(normalise("flash.attn"), "flash-attn");
        assert_eq!(normalise("LLaMA-Factory"), "llama-factory");
    }

    #[test]
    fn version_py_of_each_build() {
        // As generate_torch_version.py writes it (a ROCm build: hip set, cuda None).
        let rocm = "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n__version__ = '2.4.1+rocm6.1'\ndebug = False\ncuda: Optional[str] = None\ngit_version = 'abc'\nhip: Optional[str] = '6.1.40091-a8dbc0c19'\n";
        let v = parse_version_py(rocm);
        assert_eq!(v.version.as_deref(), Some("2.4.1+rocm6.1"));
        assert_eq!(
            (v.cuda, v.hip.as_deref()),
            (None, Some("6.1.40091-a8dbc0c19"))
        );
        let cuda = "__version__ = '2.15.0+cu132'\ncuda: Optional[str] = '13.2'\nhip: Optional[str] = None\nrocm: Optional[str] = None\n";
        let v = parse_version_py(cuda);
        assert_eq!(
            (v.cuda.as_deref(), v.hip, v.rocm),
            (Some("13.2"), None, None)
        );
    }

    #[test]
    fn metadata_and_record() {
        let meta = "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.19.1+das.opt2.dtk2504\nRequires-Dist: numpy\nRequires-Dist: torch (==2.4.1)\n\nlong description\nRequires-Dist: not-a-header\n";
        let (name, version, requires) = parse_metadata(meta);
        assert_eq!(name.as_deref(), Some("torchvision"));
        assert_eq!(version.as_deref(), Some("0.19.1+das.opt2.dtk2504"));
        assert_eq!(requires, vec!["numpy", "torch (==2.4.1)"]);
        let record = "torch/lib/libc10.so,sha256=x,10\ntorch/version.py,sha256=y,5\ntorch/lib/libgomp.so.1,sha256=z,3\n../../bin/torchrun,,\n";
        assert_eq!(
            record_libraries(record),
            vec![
                PathBuf::from("torch/lib/libc10.so"),
                PathBuf::from("torch/lib/libgomp.so.1")
            ]
        );
    }
}
