//! Helpers of hip-emu's executor tests: launching registry kernels on host buffers.
#![allow(dead_code)]

use hip_emu::exec::{self, ExecError, LaunchSpec};

/// One kernel argument as bytes.
pub fn arg<T: Copy>(v: T) -> Vec<u8> {
    let mut b = vec![0u8; std::mem::size_of::<T>()];
    // SAFETY: b has exactly size_of::<T>() bytes; T is Copy plain data.
    unsafe {
        std::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), b.as_mut_ptr(), b.len())
    };
    b
}

/// A pointer argument the kernel writes through.
pub fn ptr_mut<T>(p: *mut T) -> Vec<u8> {
    arg(p as usize)
}

/// A pointer argument.
pub fn ptr<T>(p: *const T) -> Vec<u8> {
    arg(p as usize)
}

/// Launch options beyond grid, block and arguments.
#[derive(Clone, Copy, Default)]
pub struct Opts {
    pub dynamic_lds: usize,
    pub static_lds: usize,
    pub max_flat: u32,
    pub seed: Option<u64>,
}

/// Runs `name` from the registry.
pub fn launch(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[Vec<u8>],
    o: Opts,
) -> Result<(), ExecError> {
    let kernel = exec::lookup(name).unwrap_or_else(|| panic!("{name} is not in the host registry"));
    let params: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    exec::execute(&LaunchSpec {
        kernel,
        grid,
        block,
        dynamic_lds: o.dynamic_lds,
        static_lds: o.static_lds,
        max_flat_workgroup_size: if o.max_flat == 0 { 1024 } else { o.max_flat },
        params: &params,
        block_order_seed: o.seed,
    })
}

/// True when the kernels were compiled for the host; else prints why the test is skipped.
pub fn available() -> bool {
    match exec::host_build_available() {
        Ok(()) => true,
        Err(why) => {
            if std::env::var("HIPK_REQUIRE_KERNELS").is_ok_and(|v| v == "1") {
                panic!("HIPK_REQUIRE_KERNELS=1 but hip-emu has no host kernels: {why}");
            }
            eprintln!("skipped: hip-emu has no host kernels ({why})");
            false
        }
    }
}

/// A host buffer of `n` T followed by a PROT_NONE guard page (n * size_of T rounded up to pages
/// is not required: the data ends exactly at the guard).
pub struct Guarded<T> {
    base: *mut u8,
    len: usize,
    pub data: *mut T,
    pub n: usize,
}

impl<T: Copy> Guarded<T> {
    pub fn new(n: usize, fill: T) -> Self {
        let page = 4096;
        let bytes = n * std::mem::size_of::<T>();
        let data_pages = bytes.div_ceil(page).max(1);
        let len = (data_pages + 1) * page;
        // SAFETY: a fresh anonymous mapping; the last page is made inaccessible and the data
        // placed so that it ends at that page.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let base = base.cast::<u8>();
            assert_eq!(
                libc::mprotect(base.add(data_pages * page).cast(), page, libc::PROT_NONE),
                0
            );
            let data = base.add(data_pages * page - bytes).cast::<T>();
            for i in 0..n {
                data.add(i).write_unaligned(fill);
            }
            Guarded { base, len, data, n }
        }
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made by new.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
