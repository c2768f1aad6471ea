//! Launch geometry ([`LaunchConfig`]), its validation against device limits ([`LaunchLimits`]),
//! and the kernel-argument side of a launch ([`DeviceRepr`], [`KernelArgs`]).
//!
//! Everything here is pure logic: it runs and is tested without a GPU.

use std::any::Any;
use std::ffi::c_void;
use std::marker::PhantomData;

use smallvec::SmallVec;

/// The default block size of [`LaunchConfig::for_num_elems`]: 256 threads = 4 wavefronts of 64.
pub const DEFAULT_BLOCK_SIZE: u32 = 256;

/// Why a launch configuration was rejected before HIP saw it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// A grid or block dimension is zero.
    #[error("{what} dimension {axis} is 0 ({what} = {dims:?}); every grid and block dimension must be at least 1")]
    ZeroDim {
        /// `"grid"` or `"block"`.
        what: &'static str,
        /// `'x'`, `'y'` or `'z'`.
        axis: char,
        /// The offending dimensions.
        dims: (u32, u32, u32),
    },
    /// Too many threads in one block.
    #[error("block {block:?} has {threads} threads; this kernel on this device allows at most {max} per block: use smaller blocks")]
    BlockTooLarge {
        /// The block dimensions.
        block: (u32, u32, u32),
        /// Their product.
        threads: u64,
        /// The limit.
        max: u32,
    },
    /// One block or grid dimension exceeds the device limit for that axis.
    #[error("{what}.{axis} = {value} exceeds the device limit {max} for that axis")]
    DimTooLarge {
        /// `"grid"` or `"block"`.
        what: &'static str,
        /// `'x'`, `'y'` or `'z'`.
        axis: char,
        /// The requested size.
        value: u32,
        /// The limit.
        max: u32,
    },
    /// grid × block along one axis does not fit in 32 bits (the HIP runtime's global work size).
    #[error("grid.{axis} × block.{axis} = {grid} × {block} = {total} threads, over the 2^32 - 1 that HIP can address per axis: split the launch")]
    GlobalSizeOverflow {
        /// `'x'`, `'y'` or `'z'`.
        axis: char,
        /// Grid size on that axis.
        grid: u32,
        /// Block size on that axis.
        block: u32,
        /// Their product.
        total: u64,
    },
    /// Too much dynamic shared memory (LDS).
    #[error("{requested} bytes of dynamic shared memory requested, but only {max} are available per block (device limit minus the kernel's static LDS)")]
    SharedMemTooLarge {
        /// Dynamic bytes requested.
        requested: u32,
        /// Dynamic bytes available.
        max: usize,
    },
    /// A block size of 0 or one that no device allows.
    #[error("block size {block_size} is not usable: it must be between 1 and {max}, and ideally a multiple of the wavefront size (64 on DCU)")]
    BadBlockSize {
        /// The requested block size.
        block_size: u32,
        /// The largest block size accepted.
        max: u32,
    },
    /// The element count needs more blocks than a grid dimension holds.
    #[error("{num_elems} elements at {block_size} per block need {blocks} blocks, more than grid.x allows ({max}); use a grid-stride loop")]
    TooManyElements {
        /// Elements requested.
        num_elems: u64,
        /// Threads per block.
        block_size: u32,
        /// Blocks needed.
        blocks: u64,
        /// The grid.x limit.
        max: u32,
    },
}

/// The limits a launch is checked against: a device's, possibly narrowed by a kernel's own
/// attributes (`__launch_bounds__`, static LDS) — see `Function::limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchLimits {
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Most threads along each block axis.
    pub max_block_dim: [u32; 3],
    /// Most blocks along each grid axis.
    pub max_grid_dim: [u32; 3],
    /// Dynamic shared memory (LDS) available per block, in bytes.
    pub shared_mem_per_block: usize,
    /// Threads per wavefront (64 on every DCU; 32 on some other AMD GPUs in wave32 mode).
    pub wavefront_size: u32,
}

impl LaunchLimits {
    /// The limits of a gfx906-class DCU (Z100): 1024 threads per block, 64 KiB LDS, wave64.
    /// For tests and for planning without a device; use the device's own limits to launch.
    pub const GFX906: LaunchLimits = LaunchLimits {
        max_threads_per_block: 1024,
        max_block_dim: [1024, 1024, 1024],
        max_grid_dim: [i32::MAX as u32, 65536, 65536],
        shared_mem_per_block: 65536,
        wavefront_size: 64,
    };
}

/// Grid and block dimensions plus dynamic shared memory for one kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks along x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block along x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory (LDS) per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch with `block_size` threads per block and enough blocks to give every one of
    /// `num_elems` elements a thread (the last block may be partial; the kernel must bounds-check).
    ///
    /// `num_elems == 0` yields one block: launching it is harmless for a bounds-checking kernel,
    /// but callers normally skip the launch instead.
    pub fn for_num_elems_with_block(
        num_elems: u64,
        block_size: u32,
        limits: &LaunchLimits,
    ) -> Result<Self, LaunchError> {
        let max = limits.max_threads_per_block.min(limits.max_block_dim[0]);
        if block_size == 0 || block_size > max {
            return Err(LaunchError::BadBlockSize { block_size, max });
        }
        let blocks = num_elems.div_ceil(u64::from(block_size)).max(1);
        let grid_x = u32::try_from(blocks)
            .ok()
            .filter(|g| *g <= limits.max_grid_dim[0])
            .ok_or(LaunchError::TooManyElements {
                num_elems,
                block_size,
                blocks,
                max: limits.max_grid_dim[0],
            })?;
        let cfg = LaunchConfig {
            grid: (grid_x, 1, 1),
            block: (block_size, 1, 1),
            shared_mem_bytes: 0,
        };
        cfg.validate(limits)?;
        Ok(cfg)
    }

    /// [`LaunchConfig::for_num_elems_with_block`] with [`DEFAULT_BLOCK_SIZE`] (256) threads,
    /// reduced to the device's limit if that is lower and kept a multiple of its wavefront size.
    pub fn for_num_elems(num_elems: u64, limits: &LaunchLimits) -> Result<Self, LaunchError> {
        let cap = limits.max_threads_per_block.min(limits.max_block_dim[0]);
        let wave = limits.wavefront_size.max(1);
        let mut block = DEFAULT_BLOCK_SIZE.min(cap);
        if block >= wave {
            block -= block % wave;
        }
        Self::for_num_elems_with_block(num_elems, block, limits)
    }

    /// One block of `waves` wavefronts per row, `rows` rows: the usual shape for row-wise
    /// reductions (softmax, layernorm), where each block owns one row.
    pub fn per_row(rows: u32, waves: u32, limits: &LaunchLimits) -> Result<Self, LaunchError> {
        let block = waves.saturating_mul(limits.wavefront_size);
        let cfg = LaunchConfig {
            grid: (rows, 1, 1),
            block: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        cfg.validate(limits)?;
        Ok(cfg)
    }

    /// The same configuration with `bytes` of dynamic shared memory.
    pub fn with_shared_mem(self, bytes: u32) -> Self {
        LaunchConfig {
            shared_mem_bytes: bytes,
            ..self
        }
    }

    /// Threads in one block.
    pub fn threads_per_block(&self) -> u64 {
        let (x, y, z) = self.block;
        u64::from(x) * u64::from(y) * u64::from(z)
    }

    /// Blocks in the grid.
    pub fn num_blocks(&self) -> u64 {
        let (x, y, z) = self.grid;
        u64::from(x) * u64::from(y) * u64::from(z)
    }

    /// Threads in the whole launch.
    pub fn total_threads(&self) -> u128 {
        u128::from(self.threads_per_block()) * u128::from(self.num_blocks())
    }

    /// Wavefronts per block (a partial wavefront counts as one) for a wavefront size.
    pub fn waves_per_block(&self, wavefront_size: u32) -> u64 {
        self.threads_per_block()
            .div_ceil(u64::from(wavefront_size.max(1)))
    }

    /// Check every dimension and the shared memory against `limits`.
    pub fn validate(&self, limits: &LaunchLimits) -> Result<(), LaunchError> {
        let axes = ['x', 'y', 'z'];
        let grid = [self.grid.0, self.grid.1, self.grid.2];
        let block = [self.block.0, self.block.1, self.block.2];
        for (what, dims, tuple) in [("grid", grid, self.grid), ("block", block, self.block)] {
            if let Some(i) = dims.iter().position(|d| *d == 0) {
                return Err(LaunchError::ZeroDim {
                    what,
                    axis: axes[i],
                    dims: tuple,
                });
            }
        }
        let threads = self.threads_per_block();
        if threads > u64::from(limits.max_threads_per_block) {
            return Err(LaunchError::BlockTooLarge {
                block: self.block,
                threads,
                max: limits.max_threads_per_block,
            });
        }
        for i in 0..3 {
            for (what, value, max) in [
                ("block", block[i], limits.max_block_dim[i]),
                ("grid", grid[i], limits.max_grid_dim[i]),
            ] {
                if value > max {
                    return Err(LaunchError::DimTooLarge {
                        what,
                        axis: axes[i],
                        value,
                        max,
                    });
                }
            }
            let total = u64::from(grid[i]) * u64::from(block[i]);
            if total > u64::from(u32::MAX) {
                return Err(LaunchError::GlobalSizeOverflow {
                    axis: axes[i],
                    grid: grid[i],
                    block: block[i],
                    total,
                });
            }
        }
        if self.shared_mem_bytes as usize > limits.shared_mem_per_block {
            return Err(LaunchError::SharedMemTooLarge {
                requested: self.shared_mem_bytes,
                max: limits.shared_mem_per_block,
            });
        }
        Ok(())
    }
}

/// A type whose bytes mean the same thing to a HIP kernel as to the host.
///
/// Implemented for the primitive integers and floats, `half::f16`, `half::bf16` and
/// [`DevicePtr`]. Both device buffers (`DeviceBuffer<T>`) and by-value kernel arguments require it.
///
/// # Safety
/// The implementing type must have the same size, alignment and bit-level meaning as the C type
/// the kernel declares for it (e.g. `f32` ↔ `float`, a `#[repr(C)]` struct ↔ the same C struct),
/// must contain no host pointers, references or padding whose content matters, and must be
/// valid for any bit pattern the device may write.
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

macro_rules! device_repr {
    ($($t:ty),* $(,)?) => {
        // SAFETY: each is a primitive with the same size, alignment and encoding as its C/HIP
        // counterpart on AMDGPU (little endian, IEEE floats), and every bit pattern is valid.
        $(unsafe impl DeviceRepr for $t {})*
    };
}
device_repr!(
    u8,
    i8,
    u16,
    i16,
    u32,
    i32,
    u64,
    i64,
    usize,
    isize,
    f32,
    f64,
    half::f16,
    half::bf16
);

/// A device address, as a kernel receives a pointer argument.
///
/// Only an address: it owns nothing and dereferencing it on the host is meaningless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device address.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// The address as the `void*` HIP's API takes.
    pub fn as_raw(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }

    /// The address of a raw HIP pointer.
    pub fn from_raw(ptr: *mut c_void) -> DevicePtr {
        DevicePtr(ptr as usize as u64)
    }

    /// The address `bytes` further on (wrapping is the caller's bug; it saturates instead).
    pub fn byte_add(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.saturating_add(bytes as u64))
    }

    /// True for the null address.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

// SAFETY: a 64-bit address, the same as a device `T*` on AMDGPU (64-bit pointers).
unsafe impl DeviceRepr for DevicePtr {}

/// Something that can be passed to a kernel: yields a pointer to the bytes of the argument, which
/// must stay valid and unchanged for as long as the implementor is borrowed.
///
/// # Safety
/// `arg_ptr` must point at a live value of the size and layout the kernel's parameter expects,
/// valid for the lifetime of the `&self` borrow.
pub unsafe trait KernelArg {
    /// Pointer to the argument's bytes.
    fn arg_ptr(&self) -> *const c_void;

    /// Size in bytes of the argument at [`KernelArg::arg_ptr`] (what the kernel's parameter
    /// must be). Announced to runtimes that can check it (hip-emu).
    fn arg_size(&self) -> usize;
}

// SAFETY: a `DeviceRepr` value is its own argument bytes, live while borrowed.
unsafe impl<T: DeviceRepr> KernelArg for T {
    fn arg_ptr(&self) -> *const c_void {
        (self as *const T).cast()
    }

    fn arg_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
}

/// Arguments a launch keeps without touching the heap (hipModuleLaunchKernel takes at most 4 KiB
/// of arguments; the kernels here take up to 20).
const INLINE_ARGS: usize = 32;

/// Bytes of by-value arguments kept inline, in 8-byte words (a larger total, e.g. AdamW's tensor
/// table, spills to one heap allocation).
const INLINE_VALUE_WORDS: usize = 64;

/// Where one argument's bytes are.
#[derive(Clone, Copy)]
enum Slot {
    /// Borrowed from the caller for `'a`.
    Borrowed(*mut c_void),
    /// A value copied into [`KernelArgs`]'s word storage, at this word offset.
    Inline(usize),
    /// A value boxed because its alignment exceeds 8 bytes, at this index of `boxed`.
    Boxed(usize),
}

/// Kernel arguments in C order, each kept alive until the launch that consumes them.
///
/// Arguments pushed by reference ([`KernelArgs::arg`]) are borrowed for `'a`; values pushed with
/// [`KernelArgs::value`] are copied into the builder. The array handed to `hipModuleLaunchKernel`
/// is [`KernelArgs::as_param_array`], built when it is asked for.
///
/// Queueing a launch allocates nothing on the heap for up to 32 arguments and 512 bytes of
/// by-value arguments (values aligned beyond 8 bytes are boxed).
pub struct KernelArgs<'a> {
    slots: SmallVec<[Slot; INLINE_ARGS]>,
    sizes: SmallVec<[usize; INLINE_ARGS]>,
    /// By-value arguments' bytes, each starting on an 8-byte boundary.
    words: SmallVec<[u64; INLINE_VALUE_WORDS]>,
    boxed: Vec<Box<dyn Any + Send>>,
    /// The `void**` array, rebuilt by `as_param_array` (inline storage moves with `self`).
    params: SmallVec<[*mut c_void; INLINE_ARGS]>,
    _borrows: PhantomData<&'a ()>,
}

impl Default for KernelArgs<'_> {
    fn default() -> Self {
        Self {
            slots: SmallVec::new(),
            sizes: SmallVec::new(),
            words: SmallVec::new(),
            boxed: Vec::new(),
            params: SmallVec::new(),
            _borrows: PhantomData,
        }
    }
}

impl<'a> KernelArgs<'a> {
    /// An empty argument list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Push the next argument by reference (a scalar, a [`DevicePtr`], or a device buffer/view).
    pub fn arg<A: KernelArg + ?Sized>(&mut self, arg: &'a A) -> &mut Self {
        self.slots.push(Slot::Borrowed(arg.arg_ptr().cast_mut()));
        self.sizes.push(arg.arg_size());
        self
    }

    /// Push the next argument by exclusive reference: for buffers the kernel writes, so nothing
    /// else can borrow them until the launch has been queued.
    pub fn arg_mut<A: KernelArg + ?Sized>(&mut self, arg: &'a mut A) -> &mut Self {
        let shared: &'a A = arg;
        self.arg(shared)
    }

    /// Push the next argument by value; the builder keeps a copy of its bytes.
    pub fn value<T: DeviceRepr>(&mut self, value: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        if std::mem::align_of::<T>() > std::mem::align_of::<u64>() {
            self.slots.push(Slot::Boxed(self.boxed.len()));
            self.boxed.push(Box::new(value));
        } else {
            let offset = self.words.len();
            self.words.resize(offset + size.div_ceil(8), 0);
            // SAFETY: `words[offset..]` holds at least `size` bytes just reserved for this value
            // and is aligned to 8 >= align_of::<T>(); `value` is a live `T` of `size` bytes, and
            // `DeviceRepr` types are plain bytes (Copy, no padding whose content matters).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&value as *const T).cast::<u8>(),
                    self.words.as_mut_ptr().add(offset).cast::<u8>(),
                    size,
                );
            }
            self.slots.push(Slot::Inline(offset));
        }
        self.sizes.push(size);
        self
    }

    /// How many arguments were pushed.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// The size in bytes of each argument, in push order.
    pub fn arg_sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// True when no argument was pushed.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The `void**` array of argument pointers, in push order (`kernelParams` of
    /// `hipModuleLaunchKernel`). Valid while `self` is alive, not moved and not pushed to.
    pub fn as_param_array(&mut self) -> *mut *mut c_void {
        self.params.clear();
        let base = self.words.as_mut_ptr();
        for slot in &self.slots {
            let p = match *slot {
                Slot::Borrowed(p) => p,
                // SAFETY: `offset` was a valid word offset when pushed and `words` only grows.
                Slot::Inline(offset) => unsafe { base.add(offset) }.cast::<c_void>(),
                Slot::Boxed(i) => {
                    let value: &(dyn Any + Send) = &*self.boxed[i];
                    (value as *const (dyn Any + Send))
                        .cast::<c_void>()
                        .cast_mut()
                }
            };
            self.params.push(p);
        }
        self.params.as_mut_ptr()
    }
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
