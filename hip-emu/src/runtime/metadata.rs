//! Reading a code object image: its length from its own headers (the C API passes only a
//! pointer), the gfx906 code object inside a clang offload bundle (hip-rt's parser), and the
//! AMDGPU metadata note (`NT_AMDGPU_METADATA`, msgpack) with each kernel's arguments and
//! resource figures. Every read is bounded; malformed input is an error, never a panic.

use hip_codeobj::bundle::{target_id_compatible, BundleError, CodeObjects, BUNDLE_MAGIC};
use hip_sys::hipError_t;
use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::LittleEndian;
use serde::Deserialize;

use super::error::{Fail, Res};

/// `NT_AMDGPU_METADATA`: the note type of the msgpack metadata (code object v3 and later).
const NT_AMDGPU_METADATA: u32 = 32;
/// Largest image accepted.
pub const MAX_IMAGE: u64 = 1 << 30;
const MAX_ENTRIES: u64 = 4096;
const MAX_ID: u64 = 4096;

/// One kernel argument from the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ArgMeta {
    #[serde(rename = ".name", default)]
    pub name: Option<String>,
    #[serde(rename = ".size")]
    pub size: u64,
    #[serde(rename = ".offset")]
    pub offset: u64,
    #[serde(rename = ".value_kind")]
    pub value_kind: String,
}

impl ArgMeta {
    /// Arguments the runtime fills in itself (`hidden_*`), not passed in `kernelParams`.
    pub fn is_hidden(&self) -> bool {
        self.value_kind.starts_with("hidden_")
    }
}

/// One kernel from the metadata.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KernelMeta {
    #[serde(rename = ".name")]
    pub name: String,
    #[serde(rename = ".symbol", default)]
    pub symbol: String,
    #[serde(rename = ".args", default)]
    pub args: Vec<ArgMeta>,
    #[serde(rename = ".group_segment_fixed_size", default)]
    pub group_segment_fixed_size: u64,
    #[serde(rename = ".private_segment_fixed_size", default)]
    pub private_segment_fixed_size: u64,
    #[serde(rename = ".max_flat_workgroup_size", default)]
    pub max_flat_workgroup_size: u64,
    #[serde(rename = ".vgpr_count", default)]
    pub vgpr_count: u64,
    #[serde(rename = ".sgpr_count", default)]
    pub sgpr_count: u64,
    #[serde(rename = ".wavefront_size", default)]
    pub wavefront_size: u64,
}

impl KernelMeta {
    /// The arguments passed through `kernelParams`, in order.
    pub fn explicit_args(&self) -> impl Iterator<Item = &ArgMeta> {
        self.args.iter().filter(|a| !a.is_hidden())
    }
}

#[derive(Deserialize)]
struct Root {
    #[serde(rename = "amdhsa.kernels", default)]
    kernels: Vec<KernelMeta>,
}

/// The code object chosen for the device, and its kernels.
#[derive(Debug, Clone)]
pub struct CodeObject {
    pub target: String,
    pub kernels: Vec<KernelMeta>,
}

fn invalid_image(message: String) -> Fail {
    Fail::new(hipError_t::hipErrorInvalidImage, message)
}

/// Bytes of the image at `image`, from its own headers: an offload bundle ends at its last
/// entry, an ELF at its last section or header table.
///
/// # Safety
/// `image` must point at a complete offload bundle or ELF code object (the C API contract of
/// `hipModuleLoadData`): every byte its headers describe is readable.
pub unsafe fn image_len(image: *const u8) -> Res<usize> {
    if image.is_null() {
        return Err(Fail::invalid("hipModuleLoadData: image is a null pointer"));
    }
    let read_u64 = |at: u64| -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: `at` lies inside the header region the image's own header promises (caller).
        unsafe { std::ptr::copy_nonoverlapping(image.add(at as usize), b.as_mut_ptr(), 8) };
        u64::from_le_bytes(b)
    };
    let mut head = [0u8; 24];
    // SAFETY: both formats have at least 24 header bytes; a shorter image breaks the contract.
    unsafe { std::ptr::copy_nonoverlapping(image, head.as_mut_ptr(), 24) };
    let too_big = |len: u64| {
        invalid_image(format!(
            "image claims {len} bytes (limit {MAX_IMAGE}); it is corrupt"
        ))
    };
    let len = if &head == BUNDLE_MAGIC {
        let count = read_u64(24);
        if count > MAX_ENTRIES {
            return Err(invalid_image(format!(
                "offload bundle claims {count} entries"
            )));
        }
        let (mut pos, mut end) = (32u64, 32u64);
        for _ in 0..count {
            let (offset, size, id_len) = (read_u64(pos), read_u64(pos + 8), read_u64(pos + 16));
            if id_len > MAX_ID {
                return Err(invalid_image(format!(
                    "offload bundle entry id of {id_len} bytes"
                )));
            }
            pos += 24 + id_len;
            let entry_end = offset
                .checked_add(size)
                .filter(|e| *e <= MAX_IMAGE)
                .ok_or_else(|| too_big(offset.saturating_add(size)))?;
            end = end.max(entry_end).max(pos);
        }
        end
    } else if head.starts_with(b"\x7fELF") {
        let mut h = [0u8; 64];
        // SAFETY: an ELF64 header is 64 bytes.
        unsafe { std::ptr::copy_nonoverlapping(image, h.as_mut_ptr(), 64) };
        let u16_at = |o: usize| u64::from(u16::from_le_bytes([h[o], h[o + 1]]));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap_or([0; 8]));
        let (phoff, shoff) = (u64_at(32), u64_at(40));
        let (phentsize, phnum, shentsize, shnum) = (u16_at(54), u16_at(56), u16_at(58), u16_at(60));
        let sh_end = shoff.saturating_add(shentsize * shnum);
        let ph_end = phoff.saturating_add(phentsize * phnum);
        if sh_end > MAX_IMAGE || ph_end > MAX_IMAGE {
            return Err(too_big(sh_end.max(ph_end)));
        }
        let mut end = sh_end.max(ph_end).max(64);
        if shentsize >= 64 {
            for i in 0..shnum {
                let at = shoff + i * shentsize;
                let kind = read_u64(at + 4) & 0xffff_ffff;
                let (offset, size) = (read_u64(at + 24), read_u64(at + 32));
                const SHT_NOBITS: u64 = 8;
                if kind != SHT_NOBITS {
                    let e = offset.saturating_add(size);
                    if e > MAX_IMAGE {
                        return Err(too_big(e));
                    }
                    end = end.max(e);
                }
            }
        }
        end
    } else {
        return Err(invalid_image(format!(
            "hipModuleLoadData: not a clang offload bundle or ELF code object (first bytes {:02x?})",
            &head[..8]
        )));
    };
    usize::try_from(len).map_err(|_| too_big(len))
}

/// Pick the code object for `arch` (a `gcnArchName`) and read its kernels.
pub fn parse_image(bytes: &[u8], arch: &str) -> Res<CodeObject> {
    let objects = CodeObjects::parse(bytes).map_err(|e| match e {
        BundleError::Compressed => Fail::new(
            hipError_t::hipErrorNotSupported,
            "compressed offload bundles (CCOB) are not read by hip-emu: build without --offload-compress",
        ),
        other => invalid_image(other.to_string()),
    })?;
    let (target, elf) = objects
        .objects
        .iter()
        .find(|(t, _)| target_id_compatible(t, arch))
        .ok_or_else(|| {
            Fail::new(
                hipError_t::hipErrorNoBinaryForGpu,
                format!(
                    "the image holds code objects for {:?}, none for hip-emu's {arch}: build the kernels for gfx906",
                    objects.target_ids()
                ),
            )
        })?;
    let kernels =
        kernels_of(elf).map_err(|m| invalid_image(format!("code object for {target}: {m}")))?;
    Ok(CodeObject {
        target: target.clone(),
        kernels,
    })
}

/// The kernels in the metadata note of an AMDGPU ELF code object.
pub fn kernels_of(elf: &[u8]) -> Result<Vec<KernelMeta>, String> {
    let header =
        FileHeader64::<LittleEndian>::parse(elf).map_err(|e| format!("bad ELF header: {e}"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("bad ELF header: {e}"))?;
    let sections = header
        .sections(endian, elf)
        .map_err(|e| format!("bad section table: {e}"))?;
    for section in sections.iter() {
        let Some(mut notes) = section
            .notes(endian, elf)
            .map_err(|e| format!("bad note section: {e}"))?
        else {
            continue;
        };
        while let Some(note) = notes.next().map_err(|e| format!("bad note: {e}"))? {
            if note.name() == b"AMDGPU" && note.n_type(endian) == NT_AMDGPU_METADATA {
                let root: Root = rmp_serde::from_slice(note.desc()).map_err(|e| {
                    format!("the AMDGPU metadata note is not valid msgpack metadata: {e}")
                })?;
                return Ok(root.kernels);
            }
        }
    }
    Err("no NT_AMDGPU_METADATA note (code object v3 or later is required)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_truncated_images_are_errors() {
        assert!(kernels_of(b"not an elf").is_err());
        let err = parse_image(b"__CLANG_OFFLOAD_BUNDLE__\x01\0\0\0\0\0\0\0", "gfx906").unwrap_err();
        assert_eq!(err.code, hipError_t::hipErrorInvalidImage);
        let junk = [0u8; 64];
        // SAFETY: 64 readable bytes, more than the 24 the format probe reads.
        let err = unsafe { image_len(junk.as_ptr()) }.unwrap_err();
        assert!(err.message.contains("not a clang offload bundle"), "{err}");
    }

    #[test]
    fn metadata_msgpack_decodes_args_and_resources() {
        // A metadata map in the shape clang writes, encoded by rmp-serde.
        #[derive(serde::Serialize)]
        struct Arg {
            #[serde(rename = ".size")]
            size: u64,
            #[serde(rename = ".offset")]
            offset: u64,
            #[serde(rename = ".value_kind")]
            kind: &'static str,
        }
        #[derive(serde::Serialize)]
        struct K {
            #[serde(rename = ".name")]
            name: &'static str,
            #[serde(rename = ".args")]
            args: Vec<Arg>,
            #[serde(rename = ".group_segment_fixed_size")]
            lds: u64,
            #[serde(rename = ".max_flat_workgroup_size")]
            wg: u64,
        }
        #[derive(serde::Serialize)]
        struct R {
            #[serde(rename = "amdhsa.kernels")]
            kernels: Vec<K>,
        }
        let r = R {
            kernels: vec![K {
                name: "k",
                args: vec![
                    Arg {
                        size: 8,
                        offset: 0,
                        kind: "global_buffer",
                    },
                    Arg {
                        size: 4,
                        offset: 8,
                        kind: "by_value",
                    },
                    Arg {
                        size: 8,
                        offset: 16,
                        kind: "hidden_global_offset_x",
                    },
                ],
                lds: 4096,
                wg: 256,
            }],
        };
        let bytes = rmp_serde::to_vec_named(&r).unwrap();
        let root: Root = rmp_serde::from_slice(&bytes).unwrap();
        let k = &root.kernels[0];
        assert_eq!(
            (
                k.name.as_str(),
                k.group_segment_fixed_size,
                k.max_flat_workgroup_size
            ),
            ("k", 4096, 256)
        );
        let sizes: Vec<u64> = k.explicit_args().map(|a| a.size).collect();
        assert_eq!(sizes, vec![8, 4]);
    }
}
