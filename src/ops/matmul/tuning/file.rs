//! The tuning results file: what it holds, how it is read (every malformed line is an error
//! naming the line) and how it is written (a temporary file in the same directory, renamed over
//! the old one, so a reader never sees half a file). Pure logic apart from [`ResultsFile::load`]
//! and [`ResultsFile::save`]; tested without a device.
//!
//! ```text
//! # hip-kernels GEMM tuning results ...
//! hipk-gemm-tuning 1
//! key arch gfx906:sramecc+:xnack-
//! key compute_units 60
//! key hip_runtime 5.2.21153 ROCm
//! key blas hipblas libhipblas.so.0.1
//! key hip_kernels 0.1.0
//! gemm f32 nt batch=1 m=256 n=2304 k=768 packed winner=hipblas hipk-big=20.125 hipblas=12.500
//! ```
//!
//! A `gemm` line is one shape: dtype, transposes of a and b, batch, m, n, k, `packed` or
//! `strided` (a layout with leading dimensions or batch strides), the winning candidate, then
//! every candidate's mean time of one run in microseconds (`failed` when it returned an error,
//! `wrong` when its result disagreed with the reference candidate's).

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use super::TuningError;
use crate::ops::matmul::{MatmulLayout, MatmulParams};
use crate::params::DType;

/// The first non-comment line of every results file (the format's version).
pub const MAGIC: &str = "hipk-gemm-tuning 1";

/// The five values a results file is valid for: a file whose key differs in any of them was
/// written on another machine or software stack and is never used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineKey {
    /// Full arch name with target features (`gcnArchName`, e.g. `gfx906:sramecc+:xnack-`).
    pub arch: String,
    /// Compute units.
    pub compute_units: u32,
    /// HIP runtime version and flavour (and DTK's version file, when there is one).
    pub hip_runtime: String,
    /// The BLAS library the hipBLAS candidate used (backend and file name), or `none`.
    pub blas: String,
    /// This crate's version.
    pub hip_kernels: String,
}

impl MachineKey {
    const FIELDS: [&'static str; 5] = [
        "arch",
        "compute_units",
        "hip_runtime",
        "blas",
        "hip_kernels",
    ];

    fn values(&self) -> [String; 5] {
        [
            self.arch.clone(),
            self.compute_units.to_string(),
            self.hip_runtime.clone(),
            self.blas.clone(),
            self.hip_kernels.clone(),
        ]
    }

    /// `field: file value != this machine's value` for every field that differs.
    pub fn differences(&self, this_machine: &MachineKey) -> Vec<String> {
        Self::FIELDS
            .iter()
            .zip(self.values().iter().zip(this_machine.values()))
            .filter(|(_, (file, here))| **file != *here)
            .map(|(name, (file, here))| format!("{name}: file {file:?}, this machine {here:?}"))
            .collect()
    }
}

/// One tuned shape: what the key of a results line is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShapeKey {
    /// Storage type of a, b and out.
    pub dtype: DType,
    /// a stored transposed.
    pub trans_a: bool,
    /// b stored transposed.
    pub trans_b: bool,
    /// Batch items.
    pub batch: usize,
    /// Rows of out.
    pub m: usize,
    /// Columns of out.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Every operand packed (hipBLAS takes only packed operands).
    pub packed: bool,
}

impl ShapeKey {
    /// The key of `params` in `dtype` (alpha and beta are not part of it).
    pub fn of(params: &MatmulParams, dtype: DType) -> ShapeKey {
        ShapeKey {
            dtype,
            trans_a: params.trans_a,
            trans_b: params.trans_b,
            batch: params.batch,
            m: params.m,
            n: params.n,
            k: params.k,
            packed: params.layout == MatmulLayout::PACKED,
        }
    }
}

impl fmt::Display for ShapeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |b: bool| if b { 't' } else { 'n' };
        write!(
            f,
            "{} {}{} batch={} m={} n={} k={} {}",
            self.dtype.name(),
            t(self.trans_a),
            t(self.trans_b),
            self.batch,
            self.m,
            self.n,
            self.k,
            if self.packed { "packed" } else { "strided" }
        )
    }
}

/// How one candidate did on one shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    /// Mean time of one run, in microseconds.
    Micros(f64),
    /// The candidate returned an error.
    Failed,
    /// Its result disagreed with the reference candidate's.
    Wrong,
}

impl fmt::Display for Timing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Timing::Micros(us) => write!(f, "{us:.3}"),
            Timing::Failed => f.write_str("failed"),
            Timing::Wrong => f.write_str("wrong"),
        }
    }
}

/// The result of tuning one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The candidate to run.
    pub winner: String,
    /// Every candidate tried, in the order tried.
    pub timings: Vec<(String, Timing)>,
}

/// The contents of a results file.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsFile {
    /// The machine the results were measured on.
    pub key: MachineKey,
    /// The tuned shapes.
    pub entries: BTreeMap<ShapeKey, Entry>,
}

/// The largest results file read: a file of every shape of several models is a few hundred
/// KiB; anything far larger is not one of ours.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The most characters of a malformed line quoted in an error.
const QUOTED_CHARS: usize = 120;

fn corrupt(path: &Path, line: usize, text: &str, reason: impl Into<String>) -> TuningError {
    let mut quoted: String = text.chars().take(QUOTED_CHARS).collect();
    if quoted.len() < text.len() {
        quoted.push_str(&format!("… ({} bytes)", text.len()));
    }
    TuningError::Corrupt {
        path: path.to_path_buf(),
        line,
        text: quoted,
        reason: reason.into(),
    }
}

fn parse_flag(s: &str) -> Option<(bool, bool)> {
    let b = s.as_bytes();
    let t = |c: u8| match c {
        b'n' => Some(false),
        b't' => Some(true),
        _ => None,
    };
    match b {
        [a, b] => Some((t(*a)?, t(*b)?)),
        _ => None,
    }
}

fn parse_dim(field: &str, name: &str) -> Result<usize, String> {
    let value = field
        .strip_prefix(name)
        .and_then(|r| r.strip_prefix('='))
        .ok_or_else(|| format!("expected `{name}=<count>`, found {field:?}"))?;
    value
        .parse()
        .map_err(|_| format!("{name} must be a non-negative integer, found {value:?}"))
}

fn parse_gemm(fields: &[&str]) -> Result<(ShapeKey, Entry), String> {
    if fields.len() < 9 {
        return Err(format!(
            "a gemm line needs dtype, nn|nt|tn|tt, batch=, m=, n=, k=, packed|strided, winner= \
             and at least one candidate timing; found {} fields",
            fields.len()
        ));
    }
    let dtype = DType::ALL
        .into_iter()
        .find(|d| d.name() == fields[1])
        .ok_or_else(|| format!("unknown dtype {:?} (f32, f16 or bf16)", fields[1]))?;
    let (trans_a, trans_b) = parse_flag(fields[2])
        .ok_or_else(|| format!("transposes must be nn, nt, tn or tt, found {:?}", fields[2]))?;
    let packed = match fields[7] {
        "packed" => true,
        "strided" => false,
        other => return Err(format!("layout must be packed or strided, found {other:?}")),
    };
    let key = ShapeKey {
        dtype,
        trans_a,
        trans_b,
        batch: parse_dim(fields[3], "batch")?,
        m: parse_dim(fields[4], "m")?,
        n: parse_dim(fields[5], "n")?,
        k: parse_dim(fields[6], "k")?,
        packed,
    };
    let winner = fields[8]
        .strip_prefix("winner=")
        .filter(|w| !w.is_empty())
        .ok_or_else(|| format!("expected `winner=<candidate>`, found {:?}", fields[8]))?
        .to_string();
    let mut timings = Vec::new();
    for field in &fields[9..] {
        let (name, value) = field
            .split_once('=')
            .ok_or_else(|| format!("expected `<candidate>=<microseconds>`, found {field:?}"))?;
        let timing = match value {
            "failed" => Timing::Failed,
            "wrong" => Timing::Wrong,
            v => match v.parse::<f64>() {
                Ok(us) if us.is_finite() && us >= 0.0 => Timing::Micros(us),
                _ => {
                    return Err(format!(
                        "the time of {name} must be microseconds, `failed` or `wrong`, found {v:?}"
                    ))
                }
            },
        };
        timings.push((name.to_string(), timing));
    }
    if !timings
        .iter()
        .any(|(name, t)| *name == winner && matches!(t, Timing::Micros(_)))
    {
        return Err(format!(
            "the winner {winner:?} has no measured time among the candidates on this line"
        ));
    }
    Ok((key, Entry { winner, timings }))
}

impl ResultsFile {
    /// An empty file for `key`.
    pub fn new(key: MachineKey) -> ResultsFile {
        ResultsFile {
            key,
            entries: BTreeMap::new(),
        }
    }

    /// Parse `text` (read from `path`, which errors name).
    pub fn parse(path: &Path, text: &str) -> Result<ResultsFile, TuningError> {
        let mut magic = false;
        let mut key: [Option<String>; 5] = Default::default();
        let mut entries = BTreeMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            if !magic {
                if trimmed != MAGIC {
                    return Err(corrupt(
                        path,
                        line,
                        raw,
                        format!("the first line must be {MAGIC:?} (not a tuning results file, or another format version)"),
                    ));
                }
                magic = true;
                continue;
            }
            let fields: Vec<&str> = trimmed.split_whitespace().collect();
            match fields[0] {
                "key" => {
                    let name = fields.get(1).copied().unwrap_or("");
                    let Some(slot) = MachineKey::FIELDS.iter().position(|f| *f == name) else {
                        return Err(corrupt(
                            path,
                            line,
                            raw,
                            format!(
                                "unknown key field {name:?} (expected one of {:?})",
                                MachineKey::FIELDS
                            ),
                        ));
                    };
                    if key[slot].is_some() {
                        return Err(corrupt(path, line, raw, format!("key {name} given twice")));
                    }
                    if fields.len() < 3 {
                        return Err(corrupt(path, line, raw, format!("key {name} has no value")));
                    }
                    key[slot] = Some(fields[2..].join(" "));
                }
                "gemm" => {
                    let (shape, entry) =
                        parse_gemm(&fields).map_err(|reason| corrupt(path, line, raw, reason))?;
                    if entries.insert(shape, entry).is_some() {
                        return Err(corrupt(
                            path,
                            line,
                            raw,
                            format!("shape {shape} given twice"),
                        ));
                    }
                }
                other => {
                    return Err(corrupt(
                        path,
                        line,
                        raw,
                        format!(
                            "unknown line kind {other:?} (expected `key`, `gemm` or a `#` comment)"
                        ),
                    ))
                }
            }
        }
        if !magic {
            return Err(corrupt(
                path,
                1,
                "",
                format!("empty file: no {MAGIC:?} line"),
            ));
        }
        let mut values = Vec::with_capacity(5);
        for (slot, name) in key.into_iter().zip(MachineKey::FIELDS) {
            match slot {
                Some(v) => values.push(v),
                None => {
                    let last = text.lines().count().max(1);
                    return Err(corrupt(
                        path,
                        last,
                        "",
                        format!("the key line `key {name}` is missing"),
                    ));
                }
            }
        }
        let compute_units = values[1].parse().map_err(|_| {
            let line = text
                .lines()
                .position(|l| l.trim_start().starts_with("key compute_units"));
            corrupt(
                path,
                line.map_or(1, |l| l + 1),
                &format!("key compute_units {}", values[1]),
                "compute_units must be an integer",
            )
        })?;
        let [arch, _, hip_runtime, blas, hip_kernels]: [String; 5] = values
            .try_into()
            .map_err(|_| corrupt(path, 1, "", "internal: key arity"))?;
        Ok(ResultsFile {
            key: MachineKey {
                arch,
                compute_units,
                hip_runtime,
                blas,
                hip_kernels,
            },
            entries,
        })
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut s = String::new();
        s.push_str(
            "# hip-kernels GEMM tuning results: written by HIPK_GEMM_TUNING=tune, read by\n\
             # HIPK_GEMM_TUNING=use. Used only where all five key lines match the machine.\n\
             # gemm <dtype> <transposes of a, b> batch= m= n= k= <layout> winner=<candidate>\n\
             #      then each candidate's mean time of one run in microseconds\n",
        );
        s.push_str(MAGIC);
        s.push('\n');
        for (name, value) in MachineKey::FIELDS.iter().zip(self.key.values()) {
            let _ = writeln!(s, "key {name} {value}");
        }
        for (shape, entry) in &self.entries {
            let _ = write!(s, "gemm {shape} winner={}", entry.winner);
            for (name, t) in &entry.timings {
                let _ = write!(s, " {name}={t}");
            }
            s.push('\n');
        }
        s
    }

    /// Read `path`: `Ok(None)` when it does not exist. Only a regular file of at most
    /// `MAX_FILE_BYTES` (16 MiB) is read (a FIFO, a device or a huge file is an error saying so).
    pub fn load(path: &Path) -> Result<Option<ResultsFile>, TuningError> {
        let io = |e: std::io::Error| TuningError::Io {
            path: path.to_path_buf(),
            action: "reading",
            message: e.to_string(),
        };
        let bytes = match crate::files::read_bounded(path, MAX_FILE_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        let text = String::from_utf8(bytes).map_err(|e| {
            io(std::io::Error::other(format!(
                "is not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            )))
        })?;
        Self::parse(path, &text).map(Some)
    }

    /// The lock file that serializes writers of `path`: `.<name>.lock` beside it (left in
    /// place; it holds nothing).
    pub fn lock_path(path: &Path) -> PathBuf {
        let name = path
            .file_name()
            .map_or("gemm-tuning".into(), |n| n.to_string_lossy());
        path.with_file_name(format!(".{name}.lock"))
    }

    /// Write the file to `path` atomically ([`crate::files::write_atomic`]: a temporary file in
    /// the same directory, synced, renamed over `path`; its permission bits kept), merged under
    /// a lock with what is there: shapes another tuner saved meanwhile for the same machine key
    /// are kept (this file's entry wins for a shape both have). A file for another key, or one
    /// that cannot be parsed, is replaced.
    pub fn save(&self, path: &Path) -> Result<(), TuningError> {
        let io = |action: &'static str, e: std::io::Error| TuningError::Io {
            path: path.to_path_buf(),
            action,
            message: e.to_string(),
        };
        let lock = Self::lock_path(path);
        let _lock = crate::files::FileLock::acquire(&lock).map_err(|e| TuningError::Io {
            path: lock.clone(),
            action: "locking",
            message: e.to_string(),
        })?;
        let mut merged = match Self::load(path) {
            Ok(Some(on_disk)) if on_disk.key == self.key => on_disk,
            _ => ResultsFile::new(self.key.clone()),
        };
        merged
            .entries
            .extend(self.entries.iter().map(|(k, e)| (*k, e.clone())));
        crate::files::write_atomic(path, merged.render().as_bytes()).map_err(|e| io("writing", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> MachineKey {
        MachineKey {
            arch: "gfx906:sramecc+:xnack-".into(),
            compute_units: 60,
            hip_runtime: "5.2.21153 ROCm".into(),
            blas: "hipblas libhipblas.so.0".into(),
            hip_kernels: "0.1.0".into(),
        }
    }

    fn sample() -> ResultsFile {
        let mut f = ResultsFile::new(key());
        let shape = ShapeKey {
            dtype: DType::BF16,
            trans_a: false,
            trans_b: true,
            batch: 1,
            m: 256,
            n: 2304,
            k: 768,
            packed: true,
        };
        f.entries.insert(
            shape,
            Entry {
                winner: "hipblas".into(),
                timings: vec![
                    ("hipk-big".into(), Timing::Micros(20.125)),
                    ("hipk-small".into(), Timing::Failed),
                    ("hipblas".into(), Timing::Micros(12.5)),
                ],
            },
        );
        f
    }

    #[test]
    fn a_rendered_file_parses_back_to_the_same_results() {
        let f = sample();
        let text = f.render();
        assert!(
            text.contains(
                "gemm bf16 nt batch=1 m=256 n=2304 k=768 packed winner=hipblas hipk-big=20.125 \
             hipk-small=failed hipblas=12.500"
            ),
            "{text}"
        );
        assert_eq!(ResultsFile::parse(Path::new("t"), &text).unwrap(), f);
    }

    #[test]
    fn every_malformed_line_is_an_error_naming_its_line() {
        let good = sample().render();
        let lines: Vec<&str> = good.lines().collect();
        let gemm = lines.iter().position(|l| l.starts_with("gemm")).unwrap();
        let cases: [(&str, &str); 8] = [
            (
                "gemm bf16 nt batch=1 m=256 n=2304 k=768 packed winner=hipblas hipblas=fast",
                "microseconds",
            ),
            (
                "gemm f64 nt batch=1 m=256 n=2304 k=768 packed winner=hipblas hipblas=1",
                "dtype",
            ),
            (
                "gemm bf16 xx batch=1 m=256 n=2304 k=768 packed winner=hipblas hipblas=1",
                "transposes",
            ),
            (
                "gemm bf16 nt batch=1 m=-3 n=2304 k=768 packed winner=hipblas hipblas=1",
                "m must be",
            ),
            (
                "gemm bf16 nt batch=1 m=256 n=2304 k=768 packed winner=ours hipblas=1",
                "winner",
            ),
            ("gemm bf16 nt batch=1", "needs"),
            ("key arch gfx90a", "twice"),
            ("frobnicate", "unknown line kind"),
        ];
        for (bad, reason) in cases {
            let mut l = lines.clone();
            l[gemm] = bad;
            let e = ResultsFile::parse(Path::new("/x/tuning.txt"), &l.join("\n")).unwrap_err();
            match &e {
                TuningError::Corrupt {
                    line, reason: r, ..
                } => {
                    assert_eq!(*line, gemm + 1, "{bad}: {e}");
                    assert!(r.contains(reason), "{bad}: {e}");
                }
                other => panic!("{bad}: {other}"),
            }
            let text = e.to_string();
            assert!(
                text.contains(&format!("/x/tuning.txt:{}", gemm + 1)) && text.contains(bad),
                "{text}"
            );
        }
        let e = ResultsFile::parse(Path::new("f"), "not a tuning file\n").unwrap_err();
        assert!(matches!(e, TuningError::Corrupt { line: 1, .. }), "{e}");
        let no_key: String = good
            .lines()
            .filter(|l| !l.starts_with("key blas"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = ResultsFile::parse(Path::new("f"), &no_key).unwrap_err();
        assert!(e.to_string().contains("key blas"), "{e}");
    }

    #[test]
    fn differences_name_each_field_that_differs() {
        let here = key();
        assert!(here.differences(&here).is_empty());
        let other = MachineKey {
            arch: "gfx928".into(),
            hip_kernels: "0.0.9".into(),
            ..key()
        };
        let d = other.differences(&here);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d[0].starts_with("arch: file \"gfx928\"") && d[1].starts_with("hip_kernels"),
            "{d:?}"
        );
    }

    #[test]
    fn saving_replaces_the_file_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.txt");
        std::fs::write(&path, "old contents").unwrap();
        let f = sample();
        f.save(&path).unwrap();
        assert_eq!(ResultsFile::load(&path).unwrap(), Some(f));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        // Beside it only the writers' lock file (empty, left in place).
        let mut names = names;
        names.sort();
        assert_eq!(
            names,
            [".tuning.txt.lock", "tuning.txt"].map(std::ffi::OsString::from)
        );
        assert_eq!(ResultsFile::load(&dir.path().join("absent")).unwrap(), None);
    }
    fn shape(m: usize) -> ShapeKey {
        ShapeKey {
            dtype: DType::F32,
            trans_a: false,
            trans_b: false,
            batch: 1,
            m,
            n: 64,
            k: 64,
            packed: true,
        }
    }

    fn with_shape(m: usize) -> ResultsFile {
        let mut f = ResultsFile::new(key());
        f.entries.insert(
            shape(m),
            Entry {
                winner: "hipblas".into(),
                timings: vec![("hipblas".into(), Timing::Micros(m as f64))],
            },
        );
        f
    }

    #[test]
    fn a_fifo_a_device_or_a_huge_file_is_an_error_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.txt");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()));
        let t = std::time::Instant::now();
        let e = ResultsFile::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO") && e.contains("fifo.txt"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        let e = ResultsFile::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("character device") && e.contains("/dev/zero"),
            "{e}"
        );
        let nuls = dir.path().join("nuls.txt");
        std::fs::File::create(&nuls)
            .unwrap()
            .set_len(256 << 20)
            .unwrap();
        let e = ResultsFile::load(&nuls).unwrap_err().to_string();
        assert!(e.contains("268435456") && e.len() < 300, "{e}");
        // Within the limit, a malformed line is quoted in part only.
        let long = format!("{MAGIC}\ngemm {}\n", "\0".repeat(1 << 20));
        std::fs::write(&nuls, long).unwrap();
        let e = ResultsFile::load(&nuls).unwrap_err().to_string();
        assert!(
            e.contains("nuls.txt:2") && e.len() < 1000,
            "{} bytes",
            e.len()
        );
    }

    #[test]
    fn two_tuners_saving_one_file_keep_each_others_shapes_and_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tuning.txt");
        with_shape(1).save(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Eight tuners at once, each knowing only its own shapes (as two processes would).
        std::thread::scope(|s| {
            for t in 0..8usize {
                let path = &path;
                s.spawn(move || {
                    for i in 0..5 {
                        let mut mine = ResultsFile::new(key());
                        for j in 0..=i {
                            mine.entries.extend(with_shape(100 + 10 * t + j).entries);
                        }
                        mine.save(path).unwrap();
                    }
                });
            }
        });
        let f = ResultsFile::load(&path).unwrap().unwrap();
        assert_eq!(f.entries.len(), 1 + 8 * 5, "lost shapes");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // A file of another machine is replaced, not merged.
        let other = ResultsFile {
            key: MachineKey {
                arch: "gfx928".into(),
                ..key()
            },
            ..with_shape(7)
        };
        other.save(&path).unwrap();
        assert_eq!(ResultsFile::load(&path).unwrap(), Some(other));
    }
}
