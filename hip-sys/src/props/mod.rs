//! Device properties decoded from the bytes the runtime writes, for both `hipDeviceProp_t`
//! layouts (see [`layouts`]). Pure code: the loader calls the runtime and hands the buffer here.

pub mod layouts;

use std::mem::{offset_of, size_of};

use layouts::{LegacyProps, PropsR0600};

/// Which `hipDeviceProp_t` layout a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PropsLayout {
    /// The unversioned struct filled by `hipGetDeviceProperties` on ROCm 5.x and DTK (792 bytes).
    Legacy,
    /// `hipDeviceProp_tR0600`, filled by `hipGetDevicePropertiesR0600` on ROCm >= 6 (1472 bytes).
    R0600,
}

impl PropsLayout {
    /// Size in bytes of the C struct for this layout.
    pub const fn size(self) -> usize {
        match self {
            PropsLayout::Legacy => size_of::<LegacyProps>(),
            PropsLayout::R0600 => size_of::<PropsR0600>(),
        }
    }

    /// The runtime entry point that fills this layout.
    pub const fn symbol(self) -> &'static str {
        match self {
            PropsLayout::Legacy => "hipGetDeviceProperties",
            PropsLayout::R0600 => "hipGetDevicePropertiesR0600",
        }
    }
}

impl std::fmt::Display for PropsLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            PropsLayout::Legacy => "legacy hipDeviceProp_t",
            PropsLayout::R0600 => "hipDeviceProp_tR0600",
        };
        write!(f, "{name} ({} bytes)", self.size())
    }
}

/// The properties of one device, independent of the layout they were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProps {
    /// Marketing name, e.g. "K100_AI" or "AMD Radeon VII".
    pub name: String,
    /// Full arch string with target features, e.g. "gfx906:sramecc+:xnack-".
    pub gcn_arch_name: String,
    pub total_global_mem: usize,
    pub shared_mem_per_block: usize,
    pub regs_per_block: i32,
    /// Wavefront size: 64 on every DCU and GCN/CDNA device, 32 on RDNA.
    pub warp_size: i32,
    pub max_threads_per_block: i32,
    pub max_threads_dim: [i32; 3],
    pub max_grid_size: [i32; 3],
    pub clock_rate_khz: i32,
    pub memory_clock_rate_khz: i32,
    pub memory_bus_width_bits: i32,
    pub total_const_mem: usize,
    pub major: i32,
    pub minor: i32,
    pub multi_processor_count: i32,
    pub l2_cache_size: i32,
    pub max_threads_per_multi_processor: i32,
    pub max_shared_memory_per_multi_processor: usize,
    pub pci_domain_id: i32,
    pub pci_bus_id: i32,
    pub pci_device_id: i32,
    pub integrated: bool,
    pub concurrent_kernels: bool,
    pub cooperative_launch: bool,
    pub is_large_bar: bool,
    pub asic_revision: i32,
    /// The layout these values were decoded from.
    pub layout: PropsLayout,
}

impl DeviceProps {
    /// The arch without target features: "gfx906:sramecc+:xnack-" -> "gfx906".
    pub fn arch(&self) -> &str {
        self.gcn_arch_name
            .split(':')
            .next()
            .unwrap_or(&self.gcn_arch_name)
    }

    /// Reject values no real device reports: a wrong layout guess shows up here.
    pub fn sanity_check(&self) -> Result<(), String> {
        if self.warp_size != 32 && self.warp_size != 64 {
            return Err(format!(
                "warpSize is {} (expected 32 or 64)",
                self.warp_size
            ));
        }
        if self.name.is_empty() {
            return Err("the device name is empty".to_string());
        }
        if !self.gcn_arch_name.starts_with("gfx") {
            return Err(format!(
                "gcnArchName is {:?} (expected a \"gfx...\" target)",
                self.gcn_arch_name
            ));
        }
        if self.multi_processor_count <= 0 || self.max_threads_per_block <= 0 {
            return Err(format!(
                "multiProcessorCount {} / maxThreadsPerBlock {} are not positive",
                self.multi_processor_count, self.max_threads_per_block
            ));
        }
        Ok(())
    }
}

/// The layout to read first. DTK keeps the legacy 792-byte struct even on its HIP 6.x based
/// releases (hashcat PR 4758, checked on DTK 25.04.2 / HIP 6.3), so DTK reads legacy; upstream
/// ROCm reads R0600 when it exports `hipGetDevicePropertiesR0600` (ROCm >= 6), else legacy.
/// [`crate::Hip::device_props`] falls back to the other layout if this one fails the checks.
pub fn preferred_layout(flavour: crate::Flavour, has_r0600: bool) -> PropsLayout {
    match (flavour, has_r0600) {
        (crate::Flavour::Rocm, true) => PropsLayout::R0600,
        _ => PropsLayout::Legacy,
    }
}

/// Little bounds-checked reader over the runtime's buffer.
struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn bytes<const N: usize>(&self, off: usize) -> Result<[u8; N], String> {
        self.buf
            .get(off..off + N)
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or_else(|| {
                format!(
                    "field at offset {off} is past the {}-byte buffer",
                    self.buf.len()
                )
            })
    }
    fn i32(&self, off: usize) -> Result<i32, String> {
        self.bytes::<4>(off).map(i32::from_ne_bytes)
    }
    fn flag(&self, off: usize) -> Result<bool, String> {
        self.i32(off).map(|v| v != 0)
    }
    fn usize(&self, off: usize) -> Result<usize, String> {
        self.bytes::<{ size_of::<usize>() }>(off)
            .map(usize::from_ne_bytes)
    }
    fn i32x3(&self, off: usize) -> Result<[i32; 3], String> {
        Ok([self.i32(off)?, self.i32(off + 4)?, self.i32(off + 8)?])
    }
    /// A NUL-terminated `char[len]`; a field with no NUL is an error (wrong layout).
    fn cstr(&self, off: usize, len: usize) -> Result<String, String> {
        let field = self
            .buf
            .get(off..off + len)
            .ok_or_else(|| format!("string at offset {off} is past the buffer"))?;
        let end = field
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| format!("string at offset {off} has no NUL in {len} bytes"))?;
        Ok(String::from_utf8_lossy(&field[..end]).into_owned())
    }
}

/// Expand to a `DeviceProps` read from `$r` at the offsets of mirror struct `$L`: both mirrors
/// use the header's field names, so one field list serves both layouts.
macro_rules! decode_as {
    ($L:ty, $r:expr, $layout:expr) => {{
        let r = $r;
        DeviceProps {
            name: r.cstr(offset_of!($L, name), 256)?,
            gcn_arch_name: r.cstr(offset_of!($L, gcnArchName), 256)?,
            total_global_mem: r.usize(offset_of!($L, totalGlobalMem))?,
            shared_mem_per_block: r.usize(offset_of!($L, sharedMemPerBlock))?,
            regs_per_block: r.i32(offset_of!($L, regsPerBlock))?,
            warp_size: r.i32(offset_of!($L, warpSize))?,
            max_threads_per_block: r.i32(offset_of!($L, maxThreadsPerBlock))?,
            max_threads_dim: r.i32x3(offset_of!($L, maxThreadsDim))?,
            max_grid_size: r.i32x3(offset_of!($L, maxGridSize))?,
            clock_rate_khz: r.i32(offset_of!($L, clockRate))?,
            memory_clock_rate_khz: r.i32(offset_of!($L, memoryClockRate))?,
            memory_bus_width_bits: r.i32(offset_of!($L, memoryBusWidth))?,
            total_const_mem: r.usize(offset_of!($L, totalConstMem))?,
            major: r.i32(offset_of!($L, major))?,
            minor: r.i32(offset_of!($L, minor))?,
            multi_processor_count: r.i32(offset_of!($L, multiProcessorCount))?,
            l2_cache_size: r.i32(offset_of!($L, l2CacheSize))?,
            max_threads_per_multi_processor: r.i32(offset_of!($L, maxThreadsPerMultiProcessor))?,
            max_shared_memory_per_multi_processor: r
                .usize(offset_of!($L, maxSharedMemoryPerMultiProcessor))?,
            pci_domain_id: r.i32(offset_of!($L, pciDomainID))?,
            pci_bus_id: r.i32(offset_of!($L, pciBusID))?,
            pci_device_id: r.i32(offset_of!($L, pciDeviceID))?,
            integrated: r.flag(offset_of!($L, integrated))?,
            concurrent_kernels: r.flag(offset_of!($L, concurrentKernels))?,
            cooperative_launch: r.flag(offset_of!($L, cooperativeLaunch))?,
            is_large_bar: r.flag(offset_of!($L, isLargeBar))?,
            asic_revision: r.i32(offset_of!($L, asicRevision))?,
            layout: $layout,
        }
    }};
}

/// Decode a buffer the runtime filled in `layout`. Fails (with the reason) when the buffer is
/// shorter than the layout or a string field is not NUL-terminated; does not sanity-check values
/// (see [`DeviceProps::sanity_check`]).
pub fn decode(buf: &[u8], layout: PropsLayout) -> Result<DeviceProps, String> {
    if buf.len() < layout.size() {
        return Err(format!(
            "buffer of {} bytes is shorter than the {layout}",
            buf.len()
        ));
    }
    let r = Reader { buf };
    Ok(match layout {
        PropsLayout::Legacy => decode_as!(LegacyProps, &r, layout),
        PropsLayout::R0600 => decode_as!(PropsR0600, &r, layout),
    })
}

/// Byte written past the end of the expected struct before the call; if the runtime overwrites
/// it, its struct is larger than the layout we assumed.
pub const CANARY: u8 = 0xA5;

/// Size of the buffer handed to the runtime: generously above either layout.
pub const BUFFER_SIZE: usize = 4096;

const _: () =
    assert!(BUFFER_SIZE > size_of::<LegacyProps>() && BUFFER_SIZE > size_of::<PropsR0600>());

/// A buffer for `layout`: zeroed struct area followed by canary bytes.
pub fn new_buffer(layout: PropsLayout) -> Vec<u8> {
    let mut buf = vec![CANARY; BUFFER_SIZE];
    buf[..layout.size()].fill(0);
    buf
}

/// After the call: Err if the runtime wrote past the struct size of `layout`.
pub fn check_canary(buf: &[u8], layout: PropsLayout) -> Result<(), String> {
    let tail = buf.get(layout.size()..).unwrap_or(&[]);
    match tail.iter().rposition(|&b| b != CANARY) {
        None => Ok(()),
        Some(last) => Err(format!(
            "the runtime wrote at least {} bytes, past the {layout}: its struct layout differs",
            layout.size() + last + 1
        )),
    }
}

#[cfg(test)]
mod tests;
