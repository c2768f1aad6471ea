//! [`Device`]: one HIP device, its properties, limits, allocator and Drop-error log.

use std::fmt;
use std::sync::Arc;

use hip_sys::DeviceProps;

use crate::error::{Error, ErrorLog, Result};
use crate::launch::LaunchLimits;
use crate::memory::alloc::{DeviceAllocator, DirectAllocator};
use crate::result;

/// A HIP device. Cheap to clone (an `Arc`); everything created from it (streams, events,
/// buffers, modules) keeps it alive.
///
/// HIP tracks a *current device per thread*. hip-rt makes this device current
/// ([`Device::bind_to_thread`]) before each call that depends on it (allocation, stream, event
/// and module creation), so using several devices from one thread is safe.
#[derive(Clone)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    pub(crate) ordinal: i32,
    pub(crate) props: DeviceProps,
    pub(crate) limits: LaunchLimits,
    pub(crate) allocator: Arc<dyn DeviceAllocator>,
    pub(crate) errors: ErrorLog,
    /// Makes the device current (`hipSetDevice`); unit tests substitute a no-op.
    set_current: fn(i32) -> Result<()>,
}

/// Free and total device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now.
    pub free: usize,
    /// Bytes the device has.
    pub total: usize,
}

/// The part of an emulated device's name that marks it (see [`Device::is_emulated`]).
pub const EMULATED_NAME_MARK: &str = "CPU emulation";

/// The label every figure (time, bandwidth, FLOP rate) measured on an emulated device carries.
pub const EMULATED_FIGURE_LABEL: &str = "emulated — not a performance figure";

/// The caching allocator of device `ordinal`, created on first use (one per process and
/// device, as PyTorch's).
fn shared_cache(ordinal: i32) -> Result<Arc<dyn DeviceAllocator>> {
    use crate::caching::{CachingAllocator, HipBackend};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock, PoisonError};
    type Caches = Mutex<HashMap<i32, Arc<CachingAllocator<HipBackend>>>>;
    static CACHES: OnceLock<Caches> = OnceLock::new();
    // One insert under the lock: a poisoned map is still consistent.
    let mut map = CACHES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(cache) = map.get(&ordinal) {
        return Ok(cache.clone());
    }
    let cache = Arc::new(
        CachingAllocator::new(HipBackend::new(ordinal)).map_err(|e| Error::Caching(Arc::new(e)))?,
    );
    map.insert(ordinal, cache.clone());
    Ok(cache)
}

impl Device {
    /// The number of visible HIP devices. With none (or no driver), the runtime's
    /// hipErrorNoDevice comes back as an `Err` whose text says what to check.
    pub fn count() -> Result<i32> {
        Ok(result::device::count()?)
    }

    /// Device `ordinal`, allocating through the process-wide caching allocator of that device
    /// (one per ordinal, shared by every `Device::get` of it; configured by `HIPK_ALLOC_CONF`
    /// when first created). Frees are stream-ordered and never wait for the device; see
    /// [`crate::caching`]. [`Device::get_direct`] opts out.
    pub fn get(ordinal: i32) -> Result<Device> {
        let count = Self::count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidOrdinal { ordinal, count });
        }
        Self::with_allocator(ordinal, shared_cache(ordinal)?)
    }

    /// Device `ordinal`, allocating directly with hipMalloc/hipFree (opt-in).
    ///
    /// # Host sync
    /// Every free of a buffer (its `Drop`) calls `hipFree`, which waits for the whole device
    /// to finish its queued work. Use it for debugging allocator issues, not for training.
    pub fn get_direct(ordinal: i32) -> Result<Device> {
        Self::with_allocator(ordinal, Arc::new(DirectAllocator::new(ordinal)))
    }

    /// Device `ordinal`, allocating through `allocator` (e.g. the caching allocator).
    pub fn with_allocator(ordinal: i32, allocator: Arc<dyn DeviceAllocator>) -> Result<Device> {
        let count = Self::count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::InvalidOrdinal { ordinal, count });
        }
        let props = hip_sys::hip()?.device_props(ordinal)?;
        Ok(Self::from_parts(ordinal, props, allocator, |ordinal| {
            Ok(result::device::set(ordinal)?)
        }))
    }

    fn from_parts(
        ordinal: i32,
        props: DeviceProps,
        allocator: Arc<dyn DeviceAllocator>,
        set_current: fn(i32) -> Result<()>,
    ) -> Device {
        let limits = limits_from_props(&props);
        let inner = DeviceInner {
            ordinal,
            props,
            limits,
            allocator,
            errors: ErrorLog::default(),
            set_current,
        };
        Device {
            inner: Arc::new(inner),
        }
    }

    /// A device that exists only for unit tests: gfx906-like properties, `allocator` for
    /// memory, and no `hipSetDevice` call. Any other HIP call on it fails (no device).
    #[cfg(test)]
    pub(crate) fn fake(ordinal: i32, allocator: Arc<dyn DeviceAllocator>) -> Device {
        let props = DeviceProps {
            name: "fake".into(),
            gcn_arch_name: "gfx906:sramecc+:xnack-".into(),
            total_global_mem: 1 << 30,
            shared_mem_per_block: 65536,
            regs_per_block: 65536,
            warp_size: 64,
            max_threads_per_block: 1024,
            max_threads_dim: [1024; 3],
            max_grid_size: [i32::MAX, 65536, 65536],
            clock_rate_khz: 1_700_000,
            memory_clock_rate_khz: 1_000_000,
            memory_bus_width_bits: 4096,
            total_const_mem: 1 << 20,
            major: 9,
            minor: 0,
            multi_processor_count: 60,
            l2_cache_size: 4 << 20,
            max_threads_per_multi_processor: 2560,
            max_shared_memory_per_multi_processor: 65536,
            pci_domain_id: 0,
            pci_bus_id: 3,
            pci_device_id: 0,
            integrated: false,
            concurrent_kernels: true,
            cooperative_launch: true,
            is_large_bar: false,
            asic_revision: 0,
            layout: hip_sys::PropsLayout::Legacy,
        };
        Self::from_parts(ordinal, props, allocator, |_| Ok(()))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.inner.ordinal
    }

    /// All properties, as read (and sanity-checked) by hip-sys.
    pub fn props(&self) -> &DeviceProps {
        &self.inner.props
    }

    /// The marketing name, e.g. `K100_AI`.
    pub fn name(&self) -> &str {
        &self.inner.props.name
    }

    /// Whether this device is hip-emu's CPU emulation rather than a GPU: its name says
    /// "CPU emulation" (hip-emu names every device `hip-emu (CPU emulation, not a GPU)`).
    /// Timings and bandwidths measured on such a device are host figures: label them with
    /// [`EMULATED_FIGURE_LABEL`], never as device performance.
    pub fn is_emulated(&self) -> bool {
        self.name().contains(EMULATED_NAME_MARK)
    }

    /// The full arch with target features, e.g. `gfx906:sramecc+:xnack-`.
    pub fn gcn_arch_name(&self) -> &str {
        &self.inner.props.gcn_arch_name
    }

    /// The processor alone, e.g. `gfx906`.
    pub fn arch(&self) -> &str {
        self.inner.props.arch()
    }

    /// Compute units (`multiProcessorCount`).
    pub fn compute_units(&self) -> u32 {
        self.inner.props.multi_processor_count.max(0) as u32
    }

    /// Threads per wavefront: 64 on every DCU.
    pub fn wavefront_size(&self) -> u32 {
        self.inner.limits.wavefront_size
    }

    /// Most threads per block.
    pub fn max_threads_per_block(&self) -> u32 {
        self.inner.limits.max_threads_per_block
    }

    /// Shared memory (LDS) per block, in bytes.
    pub fn shared_mem_per_block(&self) -> usize {
        self.inner.props.shared_mem_per_block
    }

    /// Total device memory, in bytes.
    pub fn total_memory(&self) -> usize {
        self.inner.props.total_global_mem
    }

    /// Peak shader clock, in kHz.
    pub fn clock_rate_khz(&self) -> i32 {
        self.inner.props.clock_rate_khz
    }

    /// The launch limits of this device (per kernel they can be narrower: `Function::limits`).
    pub fn limits(&self) -> &LaunchLimits {
        &self.inner.limits
    }

    /// The allocator buffers on this device use.
    pub fn allocator(&self) -> &Arc<dyn DeviceAllocator> {
        &self.inner.allocator
    }

    /// The PCI bus id, e.g. `0000:03:00.0`.
    pub fn pci_bus_id(&self) -> Result<String> {
        Ok(result::device::pci_bus_id(self.inner.ordinal)?)
    }

    /// Free and total memory now.
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.bind_to_thread()?;
        let (free, total) = result::device::mem_info()?;
        Ok(MemoryInfo { free, total })
    }

    /// Make this the calling thread's current HIP device.
    pub fn bind_to_thread(&self) -> Result<()> {
        (self.inner.set_current)(self.inner.ordinal)
    }

    /// Wait for all work queued on this device.
    pub fn synchronize(&self) -> Result<()> {
        self.bind_to_thread()?;
        Ok(result::device::synchronize()?)
    }

    /// The first error recorded by a `Drop` on this device's objects since the last call, if any
    /// (all recorded errors are cleared). Call it at checkpoints: Drop cannot return errors.
    pub fn check_err(&self) -> Result<()> {
        match self.inner.errors.take().0.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every recorded Drop error (at most 64) and how many more were dropped; clears the log.
    pub fn take_drop_errors(&self) -> (Vec<Error>, usize) {
        self.inner.errors.take()
    }

    /// Record an error from a destructor of an object on this device.
    pub(crate) fn record_drop_error(&self, result: Result<()>) {
        self.inner.errors.record_result(result);
    }

    /// True when both handles are the same device object (same ordinal and allocator).
    pub fn same_as(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether this device can access `peer`'s memory (`hipDeviceCanAccessPeer`); false for
    /// itself.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        Ok(result::device::can_access_peer(
            self.inner.ordinal,
            peer.ordinal(),
        )?)
    }

    /// Let kernels on this device use `peer`'s memory (`hipDeviceEnablePeerAccess`, made on
    /// this device). Enabling twice is not an error. Copies between devices do not need it
    /// ([`Stream::copy_peer`](crate::Stream::copy_peer)).
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        self.bind_to_thread()?;
        match result::device::enable_peer_access(peer.ordinal()) {
            Err(e)
                if e.hip_code() == Some(hip_sys::hipError_t::hipErrorPeerAccessAlreadyEnabled) =>
            {
                Ok(())
            }
            other => Ok(other?),
        }
    }

    /// Undo [`Device::enable_peer_access`] (`hipDeviceDisablePeerAccess`); an error if it was
    /// not enabled.
    pub fn disable_peer_access(&self, peer: &Device) -> Result<()> {
        self.bind_to_thread()?;
        Ok(result::device::disable_peer_access(peer.ordinal())?)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.props.name)
            .field("arch", &self.inner.props.gcn_arch_name)
            .field("allocator", &self.inner.allocator)
            .finish()
    }
}

/// Launch limits from device properties (negative values, which no device reports, become 0
/// and so reject every launch rather than allow a wrong one).
pub fn limits_from_props(p: &DeviceProps) -> LaunchLimits {
    let u = |v: i32| v.max(0) as u32;
    LaunchLimits {
        max_threads_per_block: u(p.max_threads_per_block),
        max_block_dim: p.max_threads_dim.map(u),
        max_grid_dim: p.max_grid_size.map(u),
        shared_mem_per_block: p.shared_mem_per_block,
        wavefront_size: u(p.warp_size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_allocator_is_one_shared_cache_per_device() {
        // Creating the cache calls no HIP function (only the first allocation does).
        let (a, b, other) = (
            shared_cache(0).unwrap(),
            shared_cache(0).unwrap(),
            shared_cache(1).unwrap(),
        );
        assert!(Arc::ptr_eq(&a, &b), "one cache per device");
        assert!(!Arc::ptr_eq(&a, &other));
        assert!(format!("{a:?}").contains("CachingAllocator"), "{a:?}");
    }

    #[test]
    fn limits_come_from_props_and_negative_values_reject_launches() {
        let d = Device::fake(0, Arc::new(DirectAllocator::new(0)));
        assert_eq!(*d.limits(), LaunchLimits::GFX906);
        assert_eq!(
            (d.wavefront_size(), d.compute_units(), d.arch()),
            (64, 60, "gfx906")
        );
        let mut props = d.props().clone();
        props.max_threads_per_block = -1;
        props.max_grid_size = [-5, 1, 1];
        let l = limits_from_props(&props);
        assert_eq!((l.max_threads_per_block, l.max_grid_dim[0]), (0, 0));
        let cfg = crate::LaunchConfig {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        assert!(cfg.validate(&l).is_err());
    }

    #[test]
    fn handles_compare_by_identity() {
        let alloc: Arc<dyn DeviceAllocator> = Arc::new(DirectAllocator::new(0));
        let (a, b) = (Device::fake(0, alloc.clone()), Device::fake(0, alloc));
        assert!(a.same_as(&a.clone()) && !a.same_as(&b));
        assert!(format!("{a:?}").contains("gfx906"));
    }
}
