//! Clang offload bundles: what `hipcc --genco` writes.
//!
//! A bundle is a container of code objects, one per offload target:
//!
//! ```text
//! "__CLANG_OFFLOAD_BUNDLE__"        24 bytes, magic
//! u64 entry count                   little endian
//! entry count × {
//!     u64 offset of the entry's bytes, from the start of the bundle
//!     u64 size of the entry's bytes
//!     u64 length of the id
//!     id bytes (no terminator), e.g. "hipv4-amdgcn-amd-amdhsa--gfx906"
//! }
//! ```
//!
//! Ids are `<kind>-<triple>[-<target id>]`. Both spellings are in use: `hipv4-amdgcn-amd-amdhsa--gfx906`
//! (empty environment component) and `hip-amdgcn-amd-amdhsa-gfx906:xnack-`. A target id is a
//! processor name followed by optional `:feature+` / `:feature-` settings.
//!
//! Compressed bundles (magic `CCOB`, written by clang ≥ 18 with `--offload-compress`) are
//! recognised and reported as [`BundleError::Compressed`] here; [`crate::compressed`]
//! decompresses them (then parse the result, or read its header with [`entry_headers`]).
//!
//! [`CodeObjects::parse`] also accepts a bare AMDGPU ELF code object, so callers can treat both
//! inputs the same way. Every read is bounds-checked: malformed input yields a [`BundleError`],
//! never a panic.

use crate::elf::{self, ElfError};

/// The 24-byte magic at the start of an uncompressed clang offload bundle.
pub const BUNDLE_MAGIC: &[u8; 24] = b"__CLANG_OFFLOAD_BUNDLE__";
/// The magic at the start of a compressed clang offload bundle.
pub const COMPRESSED_BUNDLE_MAGIC: &[u8; 4] = b"CCOB";
/// An upper bound on the entry count, so a corrupt count cannot make us allocate wildly.
const MAX_ENTRIES: u64 = 4096;

/// Why a byte buffer could not be read as an offload bundle or code object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// The buffer is neither a bundle nor an ELF code object.
    #[error(
        "not a clang offload bundle or ELF code object (first bytes {head:02x?}); \
         pass the output of `hipcc --genco` or a raw .hsaco / .co file"
    )]
    UnknownFormat {
        /// Up to the first 8 bytes of the buffer.
        head: Vec<u8>,
    },
    /// The bundle ends before a field that its header promises.
    #[error(
        "offload bundle truncated: needed {needed} bytes at offset {offset} for the {field}, \
         but the buffer holds {len} bytes; the file is damaged or was cut short"
    )]
    Truncated {
        /// What was being read.
        field: &'static str,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// The buffer's length.
        len: usize,
    },
    /// The entry count is implausible.
    #[error("offload bundle claims {count} entries (at most {MAX_ENTRIES} accepted); the header is corrupt")]
    TooManyEntries {
        /// The claimed count.
        count: u64,
    },
    /// An entry's bytes lie outside the buffer.
    #[error(
        "offload bundle entry {index} (`{id}`) spans bytes {offset}..{offset}+{size}, \
         beyond the buffer's {len} bytes; the file is damaged or was cut short"
    )]
    EntryOutOfBounds {
        /// The entry's position in the header.
        index: usize,
        /// The entry's id.
        id: String,
        /// Its claimed offset.
        offset: u64,
        /// Its claimed size.
        size: u64,
        /// The buffer's length.
        len: usize,
    },
    /// An entry id is not UTF-8.
    #[error("offload bundle entry {index} has an id that is not UTF-8; the header is corrupt")]
    BadId {
        /// The entry's position in the header.
        index: usize,
    },
    /// A compressed bundle (`CCOB`).
    #[error(
        "this is a compressed offload bundle (`CCOB`, clang --offload-compress); hip-rt cannot \
         read its entries: rebuild without --offload-compress, or let the HIP runtime load it"
    )]
    Compressed,
    /// A bare code object whose ELF could not be read.
    #[error("bad ELF code object: {0}")]
    Elf(#[from] ElfError),
}

/// One entry of an offload bundle, borrowing its bytes from the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleEntry<'a> {
    /// The full id, e.g. `hipv4-amdgcn-amd-amdhsa--gfx906`.
    pub id: &'a str,
    /// Offset of the entry's bytes in the bundle.
    pub offset: u64,
    /// The entry's bytes (empty for the host entry that hipcc writes).
    pub bytes: &'a [u8],
}

impl<'a> BundleEntry<'a> {
    /// The offload kind: `host`, `hip`, `hipv4`, `openmp`, ...
    pub fn kind(&self) -> &'a str {
        self.id.split('-').next().unwrap_or("")
    }

    /// The target id, e.g. `gfx906` or `gfx906:xnack-`, or `None` for a host entry.
    ///
    /// Parsed the way clang does: the processor is the last `-`-separated component before
    /// the first `:`.
    pub fn target_id(&self) -> Option<&'a str> {
        let before_features = self.id.split(':').next().unwrap_or("");
        let start = before_features.rfind('-')? + 1;
        let processor = before_features.get(start..)?;
        if is_gpu_processor(processor) {
            self.id.get(start..)
        } else {
            None
        }
    }

    /// The processor name alone, e.g. `gfx906` (no feature settings).
    pub fn processor(&self) -> Option<&'a str> {
        self.target_id().map(|t| t.split(':').next().unwrap_or(t))
    }

    /// True for an entry that holds a GPU code object (as opposed to the host stub).
    pub fn is_gpu(&self) -> bool {
        self.kind() != "host" && self.target_id().is_some()
    }

    /// The kernels in this entry's code object (symbols with a `.kd` kernel descriptor).
    pub fn kernel_names(&self) -> Result<Vec<String>, ElfError> {
        elf::kernel_names(self.bytes)
    }
}

/// An AMDGPU processor name as it appears in target ids (`gfx906`, `gfx90a`, `gfx1100`, ...).
fn is_gpu_processor(s: &str) -> bool {
    s.strip_prefix("gfx")
        .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A parsed clang offload bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle<'a> {
    entries: Vec<BundleEntry<'a>>,
}

impl<'a> Bundle<'a> {
    /// True when `bytes` starts with the bundle magic.
    pub fn is_bundle(bytes: &[u8]) -> bool {
        bytes.starts_with(BUNDLE_MAGIC)
    }

    /// Parse an uncompressed offload bundle.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BundleError> {
        if bytes.starts_with(COMPRESSED_BUNDLE_MAGIC) {
            return Err(BundleError::Compressed);
        }
        if !Self::is_bundle(bytes) {
            return Err(unknown_format(bytes));
        }
        let mut cur = Cursor {
            bytes,
            pos: BUNDLE_MAGIC.len() as u64,
        };
        let count = cur.u64("entry count")?;
        if count > MAX_ENTRIES {
            return Err(BundleError::TooManyEntries { count });
        }
        let mut entries = Vec::with_capacity(count as usize);
        for index in 0..count as usize {
            let offset = cur.u64("entry offset")?;
            let size = cur.u64("entry size")?;
            let id_len = cur.u64("entry id length")?;
            let id = std::str::from_utf8(cur.take(id_len, "entry id")?)
                .map_err(|_| BundleError::BadId { index })?;
            let body = offset.checked_add(size).and_then(|end| {
                bytes.get(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)
            });
            let Some(body) = body else {
                return Err(BundleError::EntryOutOfBounds {
                    index,
                    id: id.to_owned(),
                    offset,
                    size,
                    len: bytes.len(),
                });
            };
            entries.push(BundleEntry {
                id,
                offset,
                bytes: body,
            });
        }
        Ok(Bundle { entries })
    }

    /// Every entry, in header order (the host entry included).
    pub fn entries(&self) -> &[BundleEntry<'a>] {
        &self.entries
    }

    /// The entries that hold GPU code objects.
    pub fn gpu_entries(&self) -> impl Iterator<Item = &BundleEntry<'a>> {
        self.entries.iter().filter(|e| e.is_gpu())
    }

    /// The target ids of the GPU entries, e.g. `["gfx906", "gfx928:xnack-"]`.
    pub fn target_ids(&self) -> Vec<&'a str> {
        self.gpu_entries().filter_map(|e| e.target_id()).collect()
    }

    /// The GPU entry that a device with the given `gcnArchName` (e.g. `gfx906:sramecc+:xnack-`)
    /// can run, if any. See [`target_id_compatible`].
    pub fn entry_for_arch(&self, device_arch: &str) -> Option<&BundleEntry<'a>> {
        self.gpu_entries().find(|e| {
            e.target_id()
                .is_some_and(|t| target_id_compatible(t, device_arch))
        })
    }
}

/// One entry of a bundle's header: its id and where its bytes lie, read without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHeader {
    /// The full id, e.g. `hipv4-amdgcn-amd-amdhsa--gfx906`.
    pub id: String,
    /// Offset of the entry's bytes from the bundle's start.
    pub offset: u64,
    /// Size of the entry's bytes.
    pub size: u64,
}

impl EntryHeader {
    /// The processor (`gfx906`) of a GPU entry, `None` for the host entry.
    pub fn processor(&self) -> Option<String> {
        let entry = BundleEntry {
            id: &self.id,
            offset: self.offset,
            bytes: &[],
        };
        if entry.is_gpu() {
            entry.processor().map(str::to_owned)
        } else {
            None
        }
    }

    /// The target id (`gfx906:xnack-`) of a GPU entry, `None` for the host entry.
    pub fn target_id(&self) -> Option<String> {
        let entry = BundleEntry {
            id: &self.id,
            offset: self.offset,
            bytes: &[],
        };
        if entry.is_gpu() {
            entry.target_id().map(str::to_owned)
        } else {
            None
        }
    }
}

/// Reads only the header of an uncompressed bundle at the start of `prefix`: the entries' ids,
/// offsets and sizes. The entries' bytes need not be present, so a reader can take the first
/// few KiB of a bundle inside a large library (or of a decompressed `CCOB`) and stop there.
/// [`bundle_end`] says where the bundle's last entry ends.
pub fn entry_headers(prefix: &[u8]) -> Result<Vec<EntryHeader>, BundleError> {
    if prefix.starts_with(COMPRESSED_BUNDLE_MAGIC) {
        return Err(BundleError::Compressed);
    }
    if !Bundle::is_bundle(prefix) {
        return Err(unknown_format(prefix));
    }
    let mut cur = Cursor {
        bytes: prefix,
        pos: BUNDLE_MAGIC.len() as u64,
    };
    let count = cur.u64("entry count")?;
    if count > MAX_ENTRIES {
        return Err(BundleError::TooManyEntries { count });
    }
    let mut entries = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let offset = cur.u64("entry offset")?;
        let size = cur.u64("entry size")?;
        let id_len = cur.u64("entry id length")?;
        let id = std::str::from_utf8(cur.take(id_len, "entry id")?)
            .map_err(|_| BundleError::BadId { index })?;
        entries.push(EntryHeader {
            id: id.to_owned(),
            offset,
            size,
        });
    }
    Ok(entries)
}

/// Where the last entry of a bundle ends (offset + size), from its entry headers; the header's
/// own length when it has no entries. `None` when a sum overflows (a corrupt header).
pub fn bundle_end(entries: &[EntryHeader], header_len: u64) -> Option<u64> {
    entries.iter().try_fold(header_len, |end, e| {
        Some(end.max(e.offset.checked_add(e.size)?))
    })
}

/// The code objects held by a buffer: either a bundle's GPU entries or one bare ELF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObjects<'a> {
    /// `(target id, code object bytes)` per code object. A bare ELF's target id is read from
    /// its header flags (e.g. `gfx906`), or `unknown-mach-0x..` for a processor not in the table.
    pub objects: Vec<(String, &'a [u8])>,
    /// True when the buffer was an offload bundle, false for a bare ELF.
    pub from_bundle: bool,
}

impl<'a> CodeObjects<'a> {
    /// Parse a clang offload bundle or a bare AMDGPU ELF code object.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, BundleError> {
        if elf::is_elf(bytes) {
            let header = elf::Header::parse(bytes)?;
            return Ok(CodeObjects {
                objects: vec![(header.target_name(), bytes)],
                from_bundle: false,
            });
        }
        let bundle = Bundle::parse(bytes)?;
        let objects = bundle
            .gpu_entries()
            .filter_map(|e| Some((e.target_id()?.to_owned(), e.bytes)))
            .collect();
        Ok(CodeObjects {
            objects,
            from_bundle: true,
        })
    }

    /// The target ids, in order.
    pub fn target_ids(&self) -> Vec<&str> {
        self.objects.iter().map(|(t, _)| t.as_str()).collect()
    }
}

/// True when code built for `target_id` (e.g. `gfx906:xnack-`) runs on a device whose
/// `gcnArchName` is `device_arch` (e.g. `gfx906:sramecc+:xnack-`).
///
/// The processors must be equal. Each feature the code object pins (`xnack-`) must be set the
/// same way on the device, if the device reports that feature; a feature the code object leaves
/// unset ("any") matches either setting. This is the rule the HIP runtime applies.
pub fn target_id_compatible(target_id: &str, device_arch: &str) -> bool {
    let mut code = target_id.split(':');
    let mut dev = device_arch.split(':');
    if code.next() != dev.next() {
        return false;
    }
    let dev_features: Vec<&str> = dev.collect();
    code.all(|feature| {
        let name = feature.trim_end_matches(['+', '-']);
        dev_features
            .iter()
            .find(|d| d.trim_end_matches(['+', '-']) == name)
            .map_or(true, |d| *d == feature)
    })
}

fn unknown_format(bytes: &[u8]) -> BundleError {
    BundleError::UnknownFormat {
        head: bytes.iter().take(8).copied().collect(),
    }
}

/// A bounds-checked little-endian reader.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: u64,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], BundleError> {
        let truncated = BundleError::Truncated {
            field,
            offset: self.pos,
            needed: n,
            len: self.bytes.len(),
        };
        let end = self.pos.checked_add(n).ok_or_else(|| truncated.clone())?;
        let range = usize::try_from(self.pos)
            .ok()
            .zip(usize::try_from(end).ok());
        let slice = range
            .and_then(|(s, e)| self.bytes.get(s..e))
            .ok_or(truncated)?;
        self.pos = end;
        Ok(slice)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, BundleError> {
        let raw = self.take(8, field)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(raw);
        Ok(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
#[path = "bundle_tests.rs"]
mod tests;
