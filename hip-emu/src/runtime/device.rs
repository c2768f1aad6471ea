//! The emulated devices: their properties (in hip-sys's legacy `hipDeviceProp_t` layout), memory
//! capacity accounting, executor, and this thread's current device.

use std::cell::Cell;
use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use hip_sys::hipError_t;
use hip_sys::props::layouts::LegacyProps;

use super::config::{Config, MEMORY_VAR};
use super::error::{Fail, Res};
use super::queue::{Executor, LAZY_GRACE};

/// Every emulated device's name: says plainly that it is not a GPU.
pub const DEVICE_NAME: &str = "hip-emu (CPU emulation, not a GPU)";
/// The ISA the emulator claims (the code object it reads metadata from).
pub const ARCH: &str = "gfx906";
/// Full `gcnArchName`.
pub const GCN_ARCH_NAME: &str = "gfx906:sramecc+:xnack-";
pub const WAVEFRONT: i32 = 64;
pub const COMPUTE_UNITS: i32 = 60;
pub const MAX_THREADS_PER_BLOCK: i32 = 1024;
/// LDS per block (and per CU) on gfx906.
pub const LDS_PER_BLOCK: usize = 64 << 10;
/// `hipDeviceGetStreamPriorityRange`: (least, greatest) as on ROCm 5.
pub const PRIORITY_RANGE: (i32, i32) = (0, -1);

/// One emulated device.
pub struct Device {
    pub ordinal: i32,
    pub capacity: usize,
    /// Bytes charged by live allocations (rounded sizes).
    used: Mutex<usize>,
    pub executor: Arc<Executor>,
}

impl Device {
    pub fn new(ordinal: i32, config: &Config) -> Res<Device> {
        Ok(Device {
            ordinal,
            capacity: config.memory,
            used: Mutex::new(0),
            executor: Executor::start(ordinal, config.seed, config.lazy.then_some(LAZY_GRACE))?,
        })
    }

    /// Charge `bytes` against the capacity, or fail with hipErrorOutOfMemory.
    pub fn charge(&self, bytes: usize, what: &str) -> Res<()> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        match used.checked_add(bytes) {
            Some(total) if total <= self.capacity => {
                *used = total;
                Ok(())
            }
            _ => Err(Fail::new(
                hipError_t::hipErrorOutOfMemory,
                format!(
                    "{what}: device {} has {} of {} bytes free ({MEMORY_VAR}); {bytes} requested",
                    self.ordinal,
                    self.capacity - *used,
                    self.capacity
                ),
            )),
        }
    }

    pub fn release(&self, bytes: usize) {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        *used = used.saturating_sub(bytes);
    }

    /// `(free, total)`.
    pub fn mem_info(&self) -> (usize, usize) {
        let used = *self.used.lock().unwrap_or_else(|p| p.into_inner());
        (self.capacity.saturating_sub(used), self.capacity)
    }

    /// PCI location `(domain, bus, device)`: made up, one bus per device.
    pub fn pci(&self) -> (i32, i32, i32) {
        (0, 0xE0 + self.ordinal, 0)
    }

    pub fn pci_bus_id(&self) -> String {
        let (domain, bus, dev) = self.pci();
        format!("{domain:04x}:{bus:02x}:{dev:02x}.0")
    }

    /// The legacy `hipDeviceProp_t` of this device.
    pub fn legacy_props(&self) -> LegacyProps {
        // SAFETY: LegacyProps is plain data (integers, char arrays, two raw pointers) for which
        // all-zero bytes are a valid value.
        let mut p: LegacyProps = unsafe { std::mem::zeroed() };
        copy_cstr(&mut p.name, DEVICE_NAME);
        copy_cstr(&mut p.gcnArchName, GCN_ARCH_NAME);
        let (domain, bus, dev) = self.pci();
        p.totalGlobalMem = self.capacity;
        p.sharedMemPerBlock = LDS_PER_BLOCK;
        p.regsPerBlock = 65536;
        p.warpSize = WAVEFRONT;
        p.maxThreadsPerBlock = MAX_THREADS_PER_BLOCK;
        p.maxThreadsDim = [1024, 1024, 1024];
        p.maxGridSize = [i32::MAX, 65535, 65535];
        p.clockRate = 1_725_000;
        p.memoryClockRate = 1_000_000;
        p.memoryBusWidth = 4096;
        p.totalConstMem = 1 << 31;
        p.major = 9;
        p.minor = 0;
        p.multiProcessorCount = COMPUTE_UNITS;
        p.l2CacheSize = 4 << 20;
        p.maxThreadsPerMultiProcessor = 2560;
        p.clockInstructionRate = 1_000_000;
        p.concurrentKernels = 1;
        p.pciDomainID = domain;
        p.pciBusID = bus;
        p.pciDeviceID = dev;
        p.maxSharedMemoryPerMultiProcessor = LDS_PER_BLOCK;
        p.canMapHostMemory = 1;
        p.gcnArch = 906;
        p.memPitch = usize::MAX >> 1;
        p.textureAlignment = 256;
        p.texturePitchAlignment = 256;
        p
    }

    /// `hipDeviceGetAttribute` with upstream ROCm (>= 5.0) numbering; `None` if not emulated.
    pub fn attribute(&self, attr: hip_sys::hipDeviceAttribute_t) -> Option<i32> {
        use hip_sys::hipDeviceAttribute_t as A;
        let p = self.legacy_props();
        let clamp = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
        Some(match attr {
            A::hipDeviceAttributeMaxThreadsPerBlock => p.maxThreadsPerBlock,
            A::hipDeviceAttributeMaxBlockDimX => p.maxThreadsDim[0],
            A::hipDeviceAttributeMaxBlockDimY => p.maxThreadsDim[1],
            A::hipDeviceAttributeMaxBlockDimZ => p.maxThreadsDim[2],
            A::hipDeviceAttributeMaxGridDimX => p.maxGridSize[0],
            A::hipDeviceAttributeMaxGridDimY => p.maxGridSize[1],
            A::hipDeviceAttributeMaxGridDimZ => p.maxGridSize[2],
            A::hipDeviceAttributeMaxSharedMemoryPerBlock => clamp(p.sharedMemPerBlock),
            A::hipDeviceAttributeMaxSharedMemoryPerMultiprocessor => {
                clamp(p.maxSharedMemoryPerMultiProcessor)
            }
            A::hipDeviceAttributeWarpSize => p.warpSize,
            A::hipDeviceAttributeMultiprocessorCount => p.multiProcessorCount,
            A::hipDeviceAttributeComputeCapabilityMajor => p.major,
            A::hipDeviceAttributeComputeCapabilityMinor => p.minor,
            A::hipDeviceAttributeClockRate => p.clockRate,
            A::hipDeviceAttributeMemoryClockRate => p.memoryClockRate,
            A::hipDeviceAttributeMemoryBusWidth => p.memoryBusWidth,
            A::hipDeviceAttributeTotalConstantMemory => clamp(p.totalConstMem),
            A::hipDeviceAttributeL2CacheSize => p.l2CacheSize,
            A::hipDeviceAttributeMaxThreadsPerMultiProcessor => p.maxThreadsPerMultiProcessor,
            A::hipDeviceAttributeMaxRegistersPerBlock => p.regsPerBlock,
            A::hipDeviceAttributePciBusId => p.pciBusID,
            A::hipDeviceAttributePciDeviceId => p.pciDeviceID,
            A::hipDeviceAttributePciDomainID => p.pciDomainID,
            A::hipDeviceAttributeIntegrated => p.integrated,
            A::hipDeviceAttributeConcurrentKernels => p.concurrentKernels,
            A::hipDeviceAttributeCooperativeLaunch => p.cooperativeLaunch,
            A::hipDeviceAttributeIsLargeBar => p.isLargeBar,
            A::hipDeviceAttributeAsicRevision => p.asicRevision,
            A::hipDeviceAttributeStreamPrioritiesSupported => 1,
            A::hipDeviceAttributeCanMapHostMemory => p.canMapHostMemory,
            _ => return None,
        })
    }
}

/// Copy `text` into a C char array, truncated, NUL-terminated.
pub fn copy_cstr(dst: &mut [c_char], text: &str) {
    let n = text.len().min(dst.len().saturating_sub(1));
    for (d, s) in dst.iter_mut().zip(&text.as_bytes()[..n]) {
        *d = *s as c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}

thread_local! {
    static CURRENT: Cell<i32> = const { Cell::new(0) };
}

/// This thread's current device ordinal (0 until `hipSetDevice`).
pub fn current_ordinal() -> i32 {
    CURRENT.with(Cell::get)
}

pub fn set_current_ordinal(ordinal: i32) {
    CURRENT.with(|c| c.set(ordinal));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn props_decode_through_hip_sys_and_pass_its_checks() {
        let config = Config::parse(&|_| None).unwrap();
        let dev = Device::new(0, &config).unwrap();
        let props = dev.legacy_props();
        // SAFETY: reading the bytes of a plain-data struct we own.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&props as *const LegacyProps).cast::<u8>(),
                std::mem::size_of::<LegacyProps>(),
            )
        };
        let decoded = hip_sys::props::decode(bytes, hip_sys::PropsLayout::Legacy).unwrap();
        decoded.sanity_check().unwrap();
        assert_eq!(decoded.name, DEVICE_NAME);
        assert_eq!((decoded.arch(), decoded.warp_size), ("gfx906", 64));
        assert_eq!(decoded.multi_processor_count, 60);
        assert_eq!(decoded.total_global_mem, 4 << 30);
        assert_eq!(dev.pci_bus_id(), "0000:e0:00.0");
        dev.charge(3 << 30, "t").unwrap();
        let err = dev.charge(2 << 30, "hipMalloc(2147483648)").unwrap_err();
        assert_eq!(err.code, hipError_t::hipErrorOutOfMemory);
        assert!(err.message.contains("1073741824 of 4294967296"), "{err}");
        dev.release(3 << 30);
        assert_eq!(dev.mem_info(), (4 << 30, 4 << 30));
    }
}
