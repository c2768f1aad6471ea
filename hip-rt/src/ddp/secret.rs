//! The job's secret: what every rank of one job holds and an outsider does not, so that the
//! rendezvous admits only the job's own ranks (see [`super::rendezvous`]).
//!
//! Where it comes from, first found wins:
//! 1. `HIPK_RDZV_SECRET`: the secret itself (16 to 1024 bytes), exported by the launcher to
//!    every rank (`srun` and torchrun pass the environment on).
//! 2. `HIPK_RDZV_SECRET_FILE`: a file holding it, readable by its owner only (mode 0600 or
//!    narrower) and owned by this user; at most 4 KiB.
//! 3. `$HOME/.hipk/rdzv-secret`: as 2, made (32 random bytes, hex, mode 0600) by the first rank
//!    that finds it missing. Every rank of the user's jobs on machines sharing `$HOME` then
//!    holds the same secret: it keeps out other users, not the user's other jobs.
//!
//! The secret never crosses the network: each side proves it holds it with an HMAC-SHA256 of
//! the other side's random nonce.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::error::SecretError;

/// The secret itself.
pub const SECRET_VAR: &str = "HIPK_RDZV_SECRET";
/// A file holding the secret.
pub const SECRET_FILE_VAR: &str = "HIPK_RDZV_SECRET_FILE";
/// The shortest secret accepted, in bytes.
pub const MIN_SECRET: usize = 16;
/// The longest secret accepted, in bytes.
pub const MAX_SECRET: usize = 1024;
/// The largest secret file read, in bytes.
const MAX_FILE: u64 = 4096;

/// A job secret, loaded once and shared by the rendezvous threads.
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    /// A secret from its bytes (16 to 1024 of them).
    pub fn new(bytes: &[u8], source: &str) -> Result<Secret, SecretError> {
        if !(MIN_SECRET..=MAX_SECRET).contains(&bytes.len()) {
            return Err(SecretError::Length {
                origin: source.to_string(),
                len: bytes.len(),
            });
        }
        Ok(Secret(bytes.into()))
    }

    /// Load the secret as the module documentation says: `HIPK_RDZV_SECRET`, else
    /// `HIPK_RDZV_SECRET_FILE`, else `$HOME/.hipk/rdzv-secret` (made when missing).
    pub fn from_env() -> Result<Secret, SecretError> {
        Self::from_lookup(|v| std::env::var_os(v).map(|s| s.to_string_lossy().into_owned()))
    }

    /// As [`Secret::from_env`], reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Secret, SecretError> {
        if let Some(text) = lookup(SECRET_VAR) {
            return Secret::new(text.trim().as_bytes(), SECRET_VAR);
        }
        if let Some(path) = lookup(SECRET_FILE_VAR) {
            return read_file(Path::new(&path), SECRET_FILE_VAR);
        }
        let home = lookup("HOME")
            .filter(|h| !h.is_empty())
            .ok_or(SecretError::NoHome)?;
        let path = PathBuf::from(home).join(".hipk").join("rdzv-secret");
        match read_file(&path, "the default secret file") {
            Err(SecretError::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                make_file(&path)?;
                read_file(&path, "the default secret file")
            }
            other => other,
        }
    }

    /// HMAC-SHA256 of `parts` (each length-prefixed, so that no two lists give one input)
    /// under this secret, with `label` saying which message it proves.
    pub(crate) fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        let mut m = self.hmac();
        feed(&mut m, label, parts);
        m.finalize().into_bytes().into()
    }

    /// Whether `tag` is the MAC of `parts` (compared in constant time).
    pub(crate) fn verify(&self, label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
        let mut m = self.hmac();
        feed(&mut m, label, parts);
        m.verify_slice(tag).is_ok()
    }

    fn hmac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length: this cannot fail.
        <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!())
    }
}

fn feed(m: &mut Hmac<Sha256>, label: &[u8], parts: &[&[u8]]) {
    for p in std::iter::once(&label).chain(parts) {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
}

/// `n` random bytes from the kernel.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], SecretError> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|source| SecretError::Io {
            path: "/dev/urandom".into(),
            what: "reading random bytes from",
            source,
        })?;
    Ok(b)
}

fn read_file(path: &Path, source_name: &str) -> Result<Secret, SecretError> {
    use std::os::unix::fs::MetadataExt;
    let io = |what, source| SecretError::Io {
        path: path.to_path_buf(),
        what,
        source,
    };
    let file = std::fs::File::open(path).map_err(|e| io("opening", e))?;
    let meta = file
        .metadata()
        .map_err(|e| io("reading the metadata of", e))?;
    if !meta.is_file() {
        return Err(SecretError::Unsafe {
            path: path.to_path_buf(),
            why: "is not a regular file".into(),
        });
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { geteuid() };
    if meta.uid() != me {
        return Err(SecretError::Unsafe {
            path: path.to_path_buf(),
            why: format!(
                "is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            ),
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(SecretError::Unsafe {
            path: path.to_path_buf(),
            why: format!(
                "has mode {:o}: others may read it; chmod 600 it",
                meta.mode() & 0o777
            ),
        });
    }
    let mut text = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut text)
        .map_err(|e| io("reading", e))?;
    if text.len() as u64 > MAX_FILE {
        return Err(SecretError::Length {
            origin: format!("{source_name} {}", path.display()),
            len: text.len(),
        });
    }
    Secret::new(
        text.trim_ascii(),
        &format!("{source_name} {}", path.display()),
    )
}

/// Make the secret file: 32 random bytes as hex, written to a temporary file of mode 0600 and
/// linked into place, so that of several ranks making it at once the first wins and every rank
/// reads the same complete file.
fn make_file(path: &Path) -> Result<(), SecretError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |p: &Path, what, source| SecretError::Io {
        path: p.to_path_buf(),
        what,
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io(dir, "creating", e))?;
    let bytes: [u8; 32] = random()?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let tmp = dir.join(format!(".rdzv-secret.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(hex.as_bytes()).and_then(|()| f.sync_all()));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(&tmp, "writing", e));
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(()),
        // Another rank made it first: read theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(path, "linking the new secret into", e)),
    }
}

extern "C" {
    fn geteuid() -> u32;
}
