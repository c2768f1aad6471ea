//! A minimal, bounds-checked ELF64 reader for AMDGPU code objects.
//!
//! Reads just enough to diagnose a code object without the GPU: the target processor (from
//! `e_flags`) and the kernel symbols. A kernel in code object v3 and later is a `STT_OBJECT`
//! symbol named `<kernel>.kd` (its kernel descriptor); v2 objects mark kernels with the
//! `STT_AMDGPU_HSA_KERNEL` type (10). Both are recognised. Malformed input yields an
//! [`ElfError`], never a panic or an out-of-bounds read.

/// `EM_AMDGPU`, the ELF machine number of AMD GPUs.
pub const EM_AMDGPU: u16 = 224;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const STT_OBJECT: u8 = 1;
const STT_AMDGPU_HSA_KERNEL: u8 = 10;
const SYM_SIZE: u64 = 24;
const SHDR_SIZE: u64 = 64;
/// Longest symbol name read, in bytes. LLVM's longest mangled kernel names are a few KiB; a
/// longer one is a corrupt or crafted string table.
pub const MAX_NAME_BYTES: usize = 64 * 1024;
/// Most name bytes read over all symbols of one object. Names are copied, and every symbol may
/// point at the same long string, so without this cap memory and time would grow with
/// symbols × string-table size.
pub const MAX_TOTAL_NAME_BYTES: usize = 16 * 1024 * 1024;
/// `EF_AMDGPU_MACH` values from LLVM's `BinaryFormat/ELF.h` (LLVM 15). DTK-only processors
/// (gfx926, gfx928, gfx936, ...) have numbers that are not published; they print as
/// `unknown-mach-0x..`.
const MACH_TABLE: &[(u32, &str)] = &[
    (0x2c, "gfx900"),
    (0x2d, "gfx902"),
    (0x2e, "gfx904"),
    (0x2f, "gfx906"),
    (0x30, "gfx908"),
    (0x31, "gfx909"),
    (0x32, "gfx90c"),
    (0x33, "gfx1010"),
    (0x36, "gfx1030"),
    (0x3f, "gfx90a"),
    (0x40, "gfx940"),
    (0x41, "gfx1100"),
];

/// Why a buffer could not be read as an ELF64 little-endian object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    /// Missing `\x7fELF`.
    #[error("not an ELF file (no \\x7fELF magic)")]
    NotElf,
    /// 32-bit or big-endian ELF.
    #[error("unsupported ELF: class {class}, data encoding {data}; AMDGPU code objects are ELF64 little endian")]
    Unsupported {
        /// `e_ident[EI_CLASS]` (2 = 64-bit).
        class: u8,
        /// `e_ident[EI_DATA]` (1 = little endian).
        data: u8,
    },
    /// A structure lies outside the buffer.
    #[error("ELF truncated: the {what} at offset {offset} (+{size} bytes) lies beyond the {len}-byte buffer")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        size: u64,
        /// The buffer's length.
        len: usize,
    },
    /// A section header field that cannot be right.
    #[error("corrupt ELF: {0}")]
    Corrupt(String),
    /// The object exceeds a bound of this reader ([`MAX_NAME_BYTES`], [`MAX_TOTAL_NAME_BYTES`]).
    #[error(
        "ELF {what} exceed(s) this reader's limit of {limit} bytes; hipcc writes nothing like \
         it, so the object is corrupt or crafted"
    )]
    TooLarge {
        /// What is too large, e.g. `symbol 3's name`.
        what: String,
        /// The limit in bytes.
        limit: usize,
    },
}

/// True when `bytes` starts with the ELF magic.
pub fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(ELF_MAGIC)
}

/// The parts of the ELF header hip-rt cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `e_machine` (224 for AMDGPU).
    pub machine: u16,
    /// `e_flags` (holds `EF_AMDGPU_MACH` and the xnack/sramecc settings).
    pub flags: u32,
    /// `e_ident[EI_OSABI]` (64 = AMDGPU HSA).
    pub os_abi: u8,
    /// `e_ident[EI_ABIVERSION]` (1 = code object v3, 2 = v4, 3 = v5).
    pub abi_version: u8,
    shoff: u64,
    shentsize: u16,
    shnum: u16,
}

impl Header {
    /// Read and check the ELF64 header.
    pub fn parse(bytes: &[u8]) -> Result<Header, ElfError> {
        if !is_elf(bytes) {
            return Err(ElfError::NotElf);
        }
        let r = Reader(bytes);
        let (class, data) = (r.u8(4, "ELF header")?, r.u8(5, "ELF header")?);
        if class != 2 || data != 1 {
            return Err(ElfError::Unsupported { class, data });
        }
        r.slice(0, 64, "ELF header")?;
        Ok(Header {
            machine: r.u16(18, "ELF header")?,
            flags: r.u32(48, "ELF header")?,
            os_abi: r.u8(7, "ELF header")?,
            abi_version: r.u8(8, "ELF header")?,
            shoff: r.u64(40, "ELF header")?,
            shentsize: r.u16(58, "ELF header")?,
            shnum: r.u16(60, "ELF header")?,
        })
    }

    /// True for an AMDGPU code object.
    pub fn is_amdgpu(&self) -> bool {
        self.machine == EM_AMDGPU
    }

    /// The processor named by `EF_AMDGPU_MACH`, e.g. `gfx906`, or `None` if not in the table.
    pub fn processor(&self) -> Option<&'static str> {
        let mach = self.flags & 0xff;
        MACH_TABLE
            .iter()
            .find(|(m, _)| *m == mach)
            .map(|(_, name)| *name)
    }

    /// The target id, e.g. `gfx906`, `gfx906:xnack-` or `gfx90a:sramecc+:xnack+` (features only
    /// when the code object pins them, code object v4+), or `unknown-mach-0x..`.
    pub fn target_name(&self) -> String {
        let mut name = match self.processor() {
            Some(p) => p.to_owned(),
            None => format!("unknown-mach-{:#x}", self.flags & 0xff),
        };
        if self.abi_version >= 2 {
            for (feature, shift) in [("sramecc", 10), ("xnack", 8)] {
                match (self.flags >> shift) & 0x3 {
                    2 => name.push_str(&format!(":{feature}-")),
                    3 => name.push_str(&format!(":{feature}+")),
                    _ => {}
                }
            }
        }
        name
    }
}

/// One symbol-table entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// The symbol's name.
    pub name: String,
    /// `ELF64_ST_TYPE(st_info)`.
    pub kind: u8,
    /// `ELF64_ST_BIND(st_info)`.
    pub binding: u8,
    /// `st_size`.
    pub size: u64,
}

/// All symbols of `.symtab` (or `.dynsym` when the object is stripped).
pub fn symbols(bytes: &[u8]) -> Result<Vec<Symbol>, ElfError> {
    let header = Header::parse(bytes)?;
    let r = Reader(bytes);
    let sections = section_headers(&r, &header)?;
    let table = sections
        .iter()
        .find(|s| s.kind == SHT_SYMTAB)
        .or_else(|| sections.iter().find(|s| s.kind == SHT_DYNSYM));
    let Some(table) = table else {
        return Ok(Vec::new());
    };
    let strtab = sections.get(table.link as usize).ok_or_else(|| {
        ElfError::Corrupt(format!(
            "symbol table links string table {} of {}",
            table.link,
            sections.len()
        ))
    })?;
    let strings = r.slice(strtab.offset, strtab.size, "string table")?;
    let count = table.size / SYM_SIZE;
    let mut out = Vec::with_capacity(count.min(1 << 16) as usize);
    let mut name_bytes = 0usize;
    for i in 0..count {
        let at = table.offset.saturating_add(i.saturating_mul(SYM_SIZE));
        let sym = Reader(r.slice(at, SYM_SIZE, "symbol")?);
        let info = sym.u8(4, "symbol")?;
        let name_off = sym.u32(0, "symbol")? as usize;
        let tail = strings.get(name_off..).ok_or_else(|| {
            ElfError::Corrupt(format!(
                "symbol {i} name offset {name_off} outside the string table"
            ))
        })?;
        // Look for the terminator in at most MAX_NAME_BYTES + 1 bytes (a name unterminated at
        // the table's end is taken whole, as before).
        let window = &tail[..tail.len().min(MAX_NAME_BYTES + 1)];
        let name = match window.iter().position(|&b| b == 0) {
            Some(end) => &window[..end],
            None if tail.len() <= MAX_NAME_BYTES => window,
            None => {
                return Err(ElfError::TooLarge {
                    what: format!("symbol {i}'s name (at string offset {name_off})"),
                    limit: MAX_NAME_BYTES,
                })
            }
        };
        name_bytes += name.len();
        if name_bytes > MAX_TOTAL_NAME_BYTES {
            return Err(ElfError::TooLarge {
                what: format!("symbol names (total over the first {} symbols)", i + 1),
                limit: MAX_TOTAL_NAME_BYTES,
            });
        }
        out.push(Symbol {
            name: String::from_utf8_lossy(name).into_owned(),
            kind: info & 0xf,
            binding: info >> 4,
            size: sym.u64(16, "symbol")?,
        });
    }
    Ok(out)
}

/// The kernel names of an AMDGPU code object, sorted and deduplicated.
pub fn kernel_names(bytes: &[u8]) -> Result<Vec<String>, ElfError> {
    let mut names: Vec<String> = symbols(bytes)?
        .into_iter()
        .filter_map(|s| match s.kind {
            STT_OBJECT => s.name.strip_suffix(".kd").map(str::to_owned),
            STT_AMDGPU_HSA_KERNEL => Some(s.name),
            _ => None,
        })
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

struct SectionHeader {
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

fn section_headers(r: &Reader<'_>, h: &Header) -> Result<Vec<SectionHeader>, ElfError> {
    if h.shnum == 0 {
        return Ok(Vec::new());
    }
    if u64::from(h.shentsize) < SHDR_SIZE {
        return Err(ElfError::Corrupt(format!(
            "section header size {} < {SHDR_SIZE}",
            h.shentsize
        )));
    }
    (0..u64::from(h.shnum))
        .map(|i| {
            let at = h.shoff.saturating_add(i * u64::from(h.shentsize));
            let s = Reader(r.slice(at, SHDR_SIZE, "section header")?);
            Ok(SectionHeader {
                kind: s.u32(4, "section header")?,
                offset: s.u64(24, "section header")?,
                size: s.u64(32, "section header")?,
                link: s.u32(40, "section header")?,
            })
        })
        .collect()
}

/// Bounds-checked little-endian field access.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn slice(&self, offset: u64, size: u64, what: &'static str) -> Result<&'a [u8], ElfError> {
        let err = || ElfError::Truncated {
            what,
            offset,
            size,
            len: self.0.len(),
        };
        let end = offset.checked_add(size).ok_or_else(err)?;
        let start = usize::try_from(offset).map_err(|_| err())?;
        let end = usize::try_from(end).map_err(|_| err())?;
        self.0.get(start..end).ok_or_else(err)
    }

    fn array<const N: usize>(&self, offset: u64, what: &'static str) -> Result<[u8; N], ElfError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.slice(offset, N as u64, what)?);
        Ok(out)
    }

    fn u8(&self, offset: u64, what: &'static str) -> Result<u8, ElfError> {
        Ok(self.array::<1>(offset, what)?[0])
    }

    fn u16(&self, offset: u64, what: &'static str) -> Result<u16, ElfError> {
        self.array(offset, what).map(u16::from_le_bytes)
    }

    fn u32(&self, offset: u64, what: &'static str) -> Result<u32, ElfError> {
        self.array(offset, what).map(u32::from_le_bytes)
    }

    fn u64(&self, offset: u64, what: &'static str) -> Result<u64, ElfError> {
        self.array(offset, what).map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AMDGPU ELF64 object with one `.symtab` whose symbols are `(name offset, st_info)` into
    /// `strtab`: header, string table, symbol table, then 3 section headers (null, symtab, strtab).
    fn object(strtab: &[u8], symbols: &[(u32, u8)]) -> Vec<u8> {
        let str_at = 64u64;
        let sym_at = str_at + strtab.len() as u64;
        let sh_at = sym_at + symbols.len() as u64 * SYM_SIZE;
        let mut out = vec![0u8; 64];
        out[..4].copy_from_slice(ELF_MAGIC);
        out[4..9].copy_from_slice(&[2, 1, 1, 64, 2]);
        out[18..20].copy_from_slice(&EM_AMDGPU.to_le_bytes());
        out[40..48].copy_from_slice(&sh_at.to_le_bytes());
        out[48..52].copy_from_slice(&0x2fu32.to_le_bytes());
        out[58..60].copy_from_slice(&64u16.to_le_bytes());
        out[60..62].copy_from_slice(&3u16.to_le_bytes());
        out.extend_from_slice(strtab);
        for &(name, info) in symbols {
            let mut sym = [0u8; SYM_SIZE as usize];
            sym[..4].copy_from_slice(&name.to_le_bytes());
            sym[4] = info;
            out.extend_from_slice(&sym);
        }
        let section = |kind: u32, offset: u64, size: u64, link: u32| {
            let mut sh = [0u8; SHDR_SIZE as usize];
            sh[4..8].copy_from_slice(&kind.to_le_bytes());
            sh[24..32].copy_from_slice(&offset.to_le_bytes());
            sh[32..40].copy_from_slice(&size.to_le_bytes());
            sh[40..44].copy_from_slice(&link.to_le_bytes());
            sh
        };
        out.extend_from_slice(&[0u8; SHDR_SIZE as usize]);
        out.extend_from_slice(&section(
            SHT_SYMTAB,
            sym_at,
            symbols.len() as u64 * SYM_SIZE,
            2,
        ));
        out.extend_from_slice(&section(3, str_at, strtab.len() as u64, 0));
        out
    }

    #[test]
    fn kernel_descriptors_name_the_kernels() {
        let obj = object(
            b"\0main.kd\0helper\0old\0",
            &[(1, STT_OBJECT), (9, 2), (16, STT_AMDGPU_HSA_KERNEL)],
        );
        assert_eq!(Header::parse(&obj).unwrap().target_name(), "gfx906");
        assert_eq!(kernel_names(&obj).unwrap(), ["main", "old"]);
    }

    #[test]
    fn symbols_sharing_one_long_name_hit_the_total_cap() {
        // 600 symbols all naming one 32 KiB string: 19 MiB of names from a 46 KiB object.
        let mut strtab = vec![0u8];
        strtab.extend(std::iter::repeat(b'k').take(32 * 1024));
        strtab.push(0);
        let obj = object(&strtab, &vec![(1, STT_OBJECT); 600]);
        assert!(obj.len() < 64 * 1024);
        let e = symbols(&obj).unwrap_err();
        assert_eq!(
            e,
            ElfError::TooLarge {
                what: "symbol names (total over the first 513 symbols)".into(),
                limit: MAX_TOTAL_NAME_BYTES,
            }
        );
        // Just under the cap is read in full.
        let obj = object(&strtab, &vec![(1, STT_OBJECT); 512]);
        let all = symbols(&obj).unwrap();
        assert_eq!(all.len(), 512);
        assert!(all.iter().all(|s| s.name.len() == 32 * 1024));
    }

    #[test]
    fn a_name_longer_than_the_cap_is_an_error() {
        let mut strtab = vec![0u8];
        strtab.extend(std::iter::repeat(b'x').take(MAX_NAME_BYTES + 1));
        strtab.push(0);
        let e = symbols(&object(&strtab, &[(0, 0), (1, STT_OBJECT)])).unwrap_err();
        assert!(
            matches!(&e, ElfError::TooLarge { what, limit } if what.starts_with("symbol 1's name") && *limit == MAX_NAME_BYTES),
            "{e}"
        );
        assert!(e.to_string().contains("65536"), "{e}");
        // Exactly at the cap, terminated or running to the end of the table: accepted.
        strtab.truncate(1 + MAX_NAME_BYTES);
        let unterminated = symbols(&object(&strtab, &[(1, STT_OBJECT)])).unwrap();
        assert_eq!(unterminated[0].name.len(), MAX_NAME_BYTES);
        strtab.push(0);
        let terminated = symbols(&object(&strtab, &[(1, STT_OBJECT)])).unwrap();
        assert_eq!(terminated[0].name.len(), MAX_NAME_BYTES);
    }
}
