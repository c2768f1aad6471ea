//! What a shared library needs, read from its headers only: the ELF dynamic section
//! (`DT_NEEDED`, `DT_RPATH`, `DT_RUNPATH`) and the offload bundles in `.hip_fatbin` (the archs
//! its GPU code was built for).
//!
//! The file is never read whole (`libtorch_hip.so` is about 1 GB): the `object` crate reads the
//! ELF header, the section table and the dynamic section through a [`ReadCache`] (only the
//! ranges asked for), and the bundles' headers are read in small pieces, up to
//! `FATBIN_READ_LIMIT` bytes and `MAX_BUNDLES` bundles per library. A truncated or garbage
//! file is an error value, never a panic.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use hip_codeobj::bundle::{self, BUNDLE_MAGIC, COMPRESSED_BUNDLE_MAGIC};
use hip_codeobj::compressed;
use object::elf;
use object::read::elf::{Dyn, FileHeader, SectionHeader};
use object::read::ReadCache;
use object::Endianness;

/// The most bytes of `.hip_fatbin` read per library (headers only; skipped bodies not counted).
const FATBIN_READ_LIMIT: u64 = 64 << 20;
/// The most bundles looked at per library.
const MAX_BUNDLES: usize = 20_000;
/// The first read of a bundle's header; read again larger when the header is longer.
const HEADER_PROBE: usize = 4096;
/// The largest bundle header accepted (4096 entries with long ids).
const HEADER_MAX: usize = 1 << 20;
/// Bytes of a compressed bundle fed to its decoder to get the inner header.
const COMPRESSED_PROBE: usize = 1 << 20;

/// What a library's headers say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LibraryFacts {
    /// `DT_NEEDED`, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH` entries.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` entries.
    pub runpath: Vec<String>,
    /// The GPU code in `.hip_fatbin`, if the library has that section.
    pub fatbin: Option<Fatbin>,
}

/// The offload bundles of one `.hip_fatbin` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fatbin {
    /// Bundles read.
    pub bundles: usize,
    /// Of them, compressed (`CCOB`) ones, and their methods.
    pub compressed: usize,
    /// `zlib` / `zstd`, as seen.
    pub methods: BTreeSet<&'static str>,
    /// Every processor seen in any bundle (`gfx906`, ...).
    pub archs: BTreeSet<String>,
    /// Per bundle, its processors (to find the bundles that lack an arch).
    pub per_bundle: Vec<BTreeSet<String>>,
    /// Why the walk stopped early, if it did (the archs are then those of the bundles read).
    pub stopped: Option<String>,
}

impl Fatbin {
    /// How many bundles lack `arch` (the bundles read).
    pub fn bundles_without(&self, arch: &str) -> usize {
        self.per_bundle.iter().filter(|b| !b.contains(arch)).count()
    }
}

/// Reads the dynamic section and the `.hip_fatbin` bundles of the ELF file at `path`.
pub fn scan(path: &Path) -> Result<LibraryFacts, String> {
    let file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let cache = ReadCache::new(file);
    let header = elf::FileHeader64::<Endianness>::parse(&cache)
        .map_err(|e| format!("not a readable 64-bit ELF file ({len} bytes): {e}"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("bad ELF header: {e}"))?;
    let sections = header
        .sections(endian, &cache)
        .map_err(|e| format!("ELF section table unreadable (truncated file? {len} bytes): {e}"))?;
    let mut facts = LibraryFacts::default();
    if let Some((entries, link)) = sections
        .dynamic(endian, &cache)
        .map_err(|e| format!("ELF dynamic section unreadable: {e}"))?
    {
        let strings = sections
            .strings(endian, &cache, link)
            .map_err(|e| format!("ELF dynamic string table unreadable: {e}"))?;
        for entry in entries {
            let tag = entry.tag32(endian);
            let list = match tag {
                Some(elf::DT_NEEDED) => &mut facts.needed,
                Some(elf::DT_RPATH) => &mut facts.rpath,
                Some(elf::DT_RUNPATH) => &mut facts.runpath,
                _ => continue,
            };
            let value = entry
                .val32(endian)
                .and_then(|offset| strings.get(offset).ok())
                .ok_or(
                    "an ELF dynamic entry names a string outside its table: the file is damaged",
                )?;
            let text = String::from_utf8_lossy(value).into_owned();
            if tag == Some(elf::DT_NEEDED) {
                list.push(text);
            } else {
                list.extend(text.split(':').filter(|s| !s.is_empty()).map(str::to_owned));
            }
        }
    }
    let fatbin = sections
        .section_by_name(endian, b".hip_fatbin")
        .map(|(_, s)| (s.sh_offset(endian), s.sh_size(endian), s.sh_type(endian)));
    drop(cache);
    if let Some((offset, size, kind)) = fatbin {
        if kind == elf::SHT_NOBITS {
            return Err(".hip_fatbin has no bytes in the file (SHT_NOBITS)".into());
        }
        let end = offset.checked_add(size).filter(|&e| e <= len).ok_or_else(|| {
            format!(".hip_fatbin spans bytes {offset}..{offset}+{size}, past the file's {len} bytes: the file is truncated")
        })?;
        let mut file = File::open(path).map_err(|e| format!("cannot open: {e}"))?;
        facts.fatbin = Some(walk_fatbin(&mut file, offset, end)?);
    }
    Ok(facts)
}

/// Reads up to `n` bytes at `at` (fewer at the end of the range).
fn read_at(file: &mut File, at: u64, n: usize) -> Result<Vec<u8>, String> {
    file.seek(SeekFrom::Start(at))
        .map_err(|e| format!("seek to {at}: {e}"))?;
    let mut buf = Vec::with_capacity(n);
    file.take(n as u64)
        .read_to_end(&mut buf)
        .map_err(|e| format!("read at {at}: {e}"))?;
    Ok(buf)
}

/// Walks the bundles laid one after another (with zero padding) in `start..end`.
fn walk_fatbin(file: &mut File, start: u64, end: u64) -> Result<Fatbin, String> {
    let mut fatbin = Fatbin::default();
    let mut pos = start;
    let mut read = 0u64;
    while pos < end {
        if fatbin.bundles >= MAX_BUNDLES || read >= FATBIN_READ_LIMIT {
            fatbin.stopped = Some(format!(
                "stopped after {} bundles ({read} bytes read)",
                fatbin.bundles
            ));
            break;
        }
        let probe = read_at(file, pos, HEADER_PROBE.min((end - pos) as usize))?;
        read += probe.len() as u64;
        // Skip the zero padding between bundles.
        if let Some(skip) = probe.iter().position(|&b| b != 0) {
            if skip > 0 {
                pos += skip as u64;
                continue;
            }
        } else {
            pos += probe.len() as u64;
            continue;
        }
        let (archs, next) = if probe.starts_with(COMPRESSED_BUNDLE_MAGIC) {
            read_compressed(file, pos, end, &probe, &mut fatbin, &mut read)?
        } else if probe.starts_with(BUNDLE_MAGIC) {
            read_plain(file, pos, end, probe, &mut read)?
        } else {
            return Err(format!(
                ".hip_fatbin holds something that is not an offload bundle at byte {pos} (first bytes {:02x?})",
                &probe[..probe.len().min(8)]
            ));
        };
        fatbin.bundles += 1;
        fatbin.archs.extend(archs.iter().cloned());
        fatbin.per_bundle.push(archs);
        match next {
            Some(next) if next > pos => pos = next,
            _ => {
                fatbin.stopped = Some(
                    "a compressed bundle of format version 1 states no size: the bundles after it were not read"
                        .into(),
                );
                break;
            }
        }
    }
    Ok(fatbin)
}

/// The processors of a plain bundle at `pos`, and where it ends.
fn read_plain(
    file: &mut File,
    pos: u64,
    end: u64,
    mut head: Vec<u8>,
    read: &mut u64,
) -> Result<(BTreeSet<String>, Option<u64>), String> {
    let entries = loop {
        match bundle::entry_headers(&head) {
            Ok(entries) => break entries,
            Err(bundle::BundleError::Truncated { .. })
                if head.len() < HEADER_MAX && (head.len() as u64) < end - pos =>
            {
                let want = (head.len() * 4).min(HEADER_MAX).min((end - pos) as usize);
                head = read_at(file, pos, want)?;
                *read += head.len() as u64;
            }
            Err(e) => return Err(format!("offload bundle at byte {pos}: {e}")),
        }
    };
    let header_len = entries.iter().fold(BUNDLE_MAGIC.len() as u64 + 8, |n, e| {
        n.saturating_add(24 + e.id.len() as u64)
    });
    let size = bundle::bundle_end(&entries, header_len)
        .ok_or_else(|| format!("offload bundle at byte {pos}: entry sizes overflow"))?;
    if pos.checked_add(size).map_or(true, |e| e > end) {
        return Err(format!(
            "offload bundle at byte {pos} claims {size} bytes, past the end of .hip_fatbin: the file is damaged or truncated"
        ));
    }
    let archs = entries.iter().filter_map(|e| e.processor()).collect();
    Ok((archs, Some(pos + size)))
}

/// The processors of a compressed bundle at `pos`, and where it ends (when its header says).
fn read_compressed(
    file: &mut File,
    pos: u64,
    end: u64,
    probe: &[u8],
    fatbin: &mut Fatbin,
    read: &mut u64,
) -> Result<(BTreeSet<String>, Option<u64>), String> {
    let header = compressed::CompressedHeader::parse(probe)
        .map_err(|e| format!("compressed bundle at byte {pos}: {e}"))?;
    let total = header.total_size;
    let span = total.unwrap_or(end - pos).min(end - pos);
    let bytes = read_at(file, pos, (span as usize).min(COMPRESSED_PROBE))?;
    *read += bytes.len() as u64;
    let inner = compressed::decompress_prefix(&bytes, HEADER_MAX)
        .map_err(|e| format!("compressed bundle at byte {pos}: {e}"))?;
    let entries = bundle::entry_headers(&inner)
        .map_err(|e| format!("compressed bundle at byte {pos}, once decompressed: {e}"))?;
    fatbin.compressed += 1;
    fatbin.methods.insert(header.method.name());
    let archs = entries.iter().filter_map(|e| e.processor()).collect();
    if let Some(t) = total {
        if pos.checked_add(t).map_or(true, |e| e > end) {
            return Err(format!(
                "compressed bundle at byte {pos} claims {t} bytes, past the end of .hip_fatbin"
            ));
        }
    }
    Ok((archs, total.map(|t| pos + t)))
}
