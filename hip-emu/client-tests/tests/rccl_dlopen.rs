//! The emulated RCCL as a program binding RCCL at run time sees it: `libhip_emu.so` opened with
//! the loader, every entry point resolved by its `nccl.h` name and called with `nccl.h`'s C
//! types (the 128-byte `ncclUniqueId` by value, 4-byte enums as `int`), HIP through hip-rt
//! loaded from the same file. Everything ran on the CPU emulation.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::ffi::{c_char, c_int, c_void};

use hip_rt::{DeviceBuffer, Stream, StreamOptions};
use hip_sys::hipStream_t;

/// `ncclUniqueId` as nccl.h declares it.
#[repr(C)]
#[derive(Clone, Copy)]
struct NcclUniqueId {
    internal: [c_char; 128],
}

type Comm = *mut c_void;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type InitRank = unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    hipStream_t,
) -> c_int;
type Destroy = unsafe extern "C" fn(Comm) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

struct Rccl {
    lib: hip_sys::libloading::Library,
}

impl Rccl {
    fn open() -> Rccl {
        // SAFETY: loading hip-emu, whose initialisers only set up Rust statics.
        let lib = unsafe { hip_sys::libloading::Library::new(common::emu_library()) }.unwrap();
        Rccl { lib }
    }

    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller names a symbol whose nccl.h prototype is `T`.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }
}

#[test]
fn nccl_h_prototypes_resolve_and_an_all_reduce_runs_across_threads() {
    common::setup(&[("HIPK_EMU_DEVICES", "2")]);
    let rccl = Rccl::open();
    let mut v = 0;
    assert_eq!(
        // SAFETY: int* out-parameter.
        unsafe { rccl.sym::<GetVersion>("ncclGetVersion")(&mut v) },
        0
    );
    assert_eq!(v, 21804);
    for name in [
        "ncclCommInitAll",
        "ncclCommAbort",
        "ncclCommGetAsyncError",
        "ncclCommCount",
        "ncclCommCuDevice",
        "ncclCommUserRank",
        "ncclReduceScatter",
        "ncclAllGather",
        "ncclBroadcast",
        "ncclReduce",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclGetLastError",
    ] {
        assert!(
            // SAFETY: only checks that the symbol exists.
            unsafe { rccl.lib.get::<*const c_void>(name.as_bytes()) }.is_ok(),
            "{name}"
        );
    }
    // SAFETY: returns a static string.
    let text =
        unsafe { std::ffi::CStr::from_ptr(rccl.sym::<ErrorString>("ncclGetErrorString")(6)) };
    assert!(text.to_str().unwrap().contains("remote process exited"));
    let mut id = NcclUniqueId { internal: [0; 128] };
    assert_eq!(
        // SAFETY: ncclUniqueId* out-parameter.
        unsafe { rccl.sym::<GetUniqueId>("ncclGetUniqueId")(&mut id) },
        0
    );
    let init: InitRank = rccl.sym("ncclCommInitRank");
    let all_reduce: AllReduce = rccl.sym("ncclAllReduce");
    let destroy: Destroy = rccl.sym("ncclCommDestroy");
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let dev = hip_rt::Device::get(rank).unwrap();
                    dev.bind_to_thread().unwrap();
                    let mut comm: Comm = std::ptr::null_mut();
                    // SAFETY: comm out-parameter, id by value, as nccl.h declares.
                    assert_eq!(unsafe { init(&mut comm, 2, id, rank) }, 0);
                    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
                    let data: Vec<f32> = (0..100).map(|i| (i + 1000 * rank) as f32).collect();
                    let buf = DeviceBuffer::from_slice(&stream, &data).unwrap();
                    let p = buf.device_ptr().as_raw();
                    // SAFETY: 100 f32 on this rank's device, in place; float32 = 7, sum = 0.
                    let rc = unsafe { all_reduce(p, p, 100, 7, 0, comm, stream.raw()) };
                    assert_eq!(rc, 0);
                    let out = buf.to_vec(&stream).unwrap();
                    // SAFETY: a live comm, destroyed once.
                    assert_eq!(unsafe { destroy(comm) }, 0);
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f32> = (0..100).map(|i| (2 * i + 1000) as f32).collect();
    assert_eq!(sums, vec![want.clone(), want]);
}
