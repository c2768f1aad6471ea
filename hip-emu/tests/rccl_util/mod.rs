//! Shared by the emulated-RCCL tests: the C ABI called directly through hip-emu's rlib (the same
//! functions `libhip_emu.so` exports), device buffers, and an independent CPU reference of every
//! reduction (computed in f64 / i128 and rounded or wrapped to the element type each step).
#![allow(dead_code)]

use std::ffi::{c_int, c_void, CStr};
use std::sync::{Mutex, MutexGuard, Once};

use half::{bf16, f16};
use hip_emu::rccl::api::*;
use hip_emu::rccl::comm::UniqueId;
use hip_emu::rccl::NcclResult;
use hip_emu::runtime::api_device::hipSetDevice;
use hip_emu::runtime::api_memory::{hipFree, hipMalloc, hipMemcpy};
use hip_emu::runtime::api_stream::{hipStreamCreate, hipStreamSynchronize};
use hip_sys::{hipError_t, hipMemcpyKind, hipStream_t};

/// Set the emulator's environment once per test process, before its first runtime call, and
/// run the tests of a process one at a time: each device's executor runs one command at a time,
/// so communicators of concurrent tests sharing devices could wait on each other in opposite
/// orders (as NCCL documents for concurrent communicators).
pub fn setup(devices: usize, timeout_ms: u64) -> MutexGuard<'static, ()> {
    static ONCE: Once = Once::new();
    static SERIAL: Mutex<()> = Mutex::new(());
    ONCE.call_once(|| {
        std::env::set_var("HIPK_EMU_DEVICES", devices.to_string());
        std::env::set_var("HIPK_EMU_RCCL_TIMEOUT_MS", timeout_ms.to_string());
    });
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn hip_ok(e: hipError_t, what: &str) {
    assert_eq!(e, hipError_t::hipSuccess, "{what}: {}", last_hip());
}

pub fn last_hip() -> String {
    let p = hip_emu::runtime::api_device::hipemuLastErrorMessage();
    // SAFETY: returns a NUL-terminated string that lives for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub fn last_nccl(comm: NcclComm) -> String {
    // SAFETY: a null or live comm; returns a NUL-terminated string that lives for the process.
    unsafe { CStr::from_ptr(ncclGetLastError(comm)) }
        .to_string_lossy()
        .into_owned()
}

pub fn nccl_ok(r: NcclResult, what: &str) {
    assert_eq!(
        r,
        NcclResult::SUCCESS,
        "{what}: {}",
        last_nccl(std::ptr::null_mut())
    );
}

pub fn set_device(d: i32) {
    // SAFETY: plain integer argument.
    hip_ok(unsafe { hipSetDevice(d) }, "hipSetDevice");
}

/// A device allocation of `bytes` on `device`, freed on drop.
pub struct Buf {
    pub ptr: *mut c_void,
    pub bytes: usize,
}

// SAFETY: the pointer is a device allocation, used by one test thread at a time.
unsafe impl Send for Buf {}

impl Buf {
    pub fn new(device: i32, bytes: usize) -> Buf {
        set_device(device);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: out-parameter.
        hip_ok(unsafe { hipMalloc(&mut ptr, bytes.max(1)) }, "hipMalloc");
        Buf { ptr, bytes }
    }

    pub fn from_bytes(device: i32, data: &[u8]) -> Buf {
        let b = Buf::new(device, data.len());
        b.write(data);
        b
    }

    pub fn write(&self, data: &[u8]) {
        assert!(data.len() <= self.bytes);
        // SAFETY: data.len() bytes from a host slice into this allocation.
        let e = unsafe {
            hipMemcpy(
                self.ptr,
                data.as_ptr().cast(),
                data.len(),
                hipMemcpyKind::hipMemcpyHostToDevice,
            )
        };
        hip_ok(e, "hipMemcpy H2D");
    }

    pub fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.bytes];
        // SAFETY: self.bytes bytes from this allocation into a host vector of that size.
        let e = unsafe {
            hipMemcpy(
                v.as_mut_ptr().cast(),
                self.ptr,
                self.bytes,
                hipMemcpyKind::hipMemcpyDeviceToHost,
            )
        };
        hip_ok(e, "hipMemcpy D2H");
        v
    }

    /// The pointer `elems` elements of `size` bytes in.
    pub fn at(&self, elems: usize, size: usize) -> *mut c_void {
        // SAFETY: pointer arithmetic inside (or one past) the allocation.
        unsafe { self.ptr.cast::<u8>().add(elems * size).cast() }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: a pointer hipMalloc returned, freed once.
        unsafe { hipFree(self.ptr) };
    }
}

pub fn stream(device: i32) -> hipStream_t {
    set_device(device);
    let mut s = std::ptr::null_mut();
    // SAFETY: out-parameter.
    hip_ok(unsafe { hipStreamCreate(&mut s) }, "hipStreamCreate");
    s
}

pub fn sync(s: hipStream_t) -> hipError_t {
    // SAFETY: a live stream.
    unsafe { hipStreamSynchronize(s) }
}

/// Communicators for `devices` (InitAll), with one stream each.
pub fn init_all(devices: &[i32]) -> (Vec<NcclComm>, Vec<hipStream_t>) {
    let mut comms = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: room for devices.len() handles; devlist of that length.
    nccl_ok(
        unsafe { ncclCommInitAll(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) },
        "ncclCommInitAll",
    );
    let streams = devices.iter().map(|&d| stream(d)).collect();
    (comms, streams)
}

pub fn destroy(comms: &[NcclComm]) {
    for &c in comms {
        // SAFETY: a live comm.
        nccl_ok(unsafe { ncclCommDestroy(c) }, "ncclCommDestroy");
    }
}

pub fn unique_id() -> UniqueId {
    let mut id = UniqueId { internal: [0; 128] };
    // SAFETY: out-parameter.
    nccl_ok(unsafe { ncclGetUniqueId(&mut id) }, "ncclGetUniqueId");
    id
}

pub fn id_to_hex(id: &UniqueId) -> String {
    id.internal
        .iter()
        .map(|&c| format!("{:02x}", c as u8))
        .collect()
}

pub fn id_from_hex(hex: &str) -> UniqueId {
    let mut id = UniqueId { internal: [0; 128] };
    for (i, d) in id.internal.iter_mut().enumerate() {
        *d = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex id") as std::ffi::c_char;
    }
    id
}

pub fn group<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: no arguments.
    nccl_ok(unsafe { ncclGroupStart() }, "ncclGroupStart");
    let r = f();
    // SAFETY: no arguments.
    nccl_ok(unsafe { ncclGroupEnd() }, "ncclGroupEnd");
    r
}

// -------------------------------------------------------------------------------------------
// Element values and the CPU reference
// -------------------------------------------------------------------------------------------

/// Data types by their ncclDataType_t value: (value, name, size, signed integer, float).
pub const DTYPES: [(c_int, &str, usize); 10] = [
    (0, "int8", 1),
    (1, "uint8", 1),
    (2, "int32", 4),
    (3, "uint32", 4),
    (4, "int64", 8),
    (5, "uint64", 8),
    (6, "float16", 2),
    (7, "float32", 4),
    (8, "float64", 8),
    (9, "bfloat16", 2),
];
pub const OPS: [(c_int, &str); 5] = [(0, "sum"), (1, "prod"), (2, "max"), (3, "min"), (4, "avg")];

/// A value of any data type, held wide.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum V {
    I(i128),
    F(f64),
}

pub fn is_float(dt: c_int) -> bool {
    matches!(dt, 6..=9)
}

/// Wrap an integer to `dt`'s width and signedness.
fn wrap(dt: c_int, x: i128) -> i128 {
    match dt {
        0 => x as i8 as i128,
        1 => x as u8 as i128,
        2 => x as i32 as i128,
        3 => x as u32 as i128,
        4 => x as i64 as i128,
        5 => x as u64 as i128,
        _ => unreachable!(),
    }
}

/// Round a float to `dt` (to nearest even).
fn round(dt: c_int, x: f64) -> f64 {
    match dt {
        6 => f16::from_f64(x).to_f64(),
        7 => x as f32 as f64,
        8 => x,
        9 => bf16::from_f64(x).to_f64(),
        _ => unreachable!(),
    }
}

/// Input element `i` of rank `r` for data type `dt`: small values, some negative, so every op
/// (prod included) stays exact in integers and meaningful in floats; `salt` varies them.
pub fn input(dt: c_int, r: usize, i: usize, salt: usize) -> V {
    let k = ((r * 7 + i * 3 + salt * 5) % 11) as i128 - 4;
    if is_float(dt) {
        // Quarters exercise rounding in f16/bf16 products and avg.
        V::F(round(dt, k as f64 * 1.25 + (i % 3) as f64 * 0.0625))
    } else {
        V::I(wrap(dt, k * 13 + i as i128))
    }
}

pub fn encode(dt: c_int, vals: &[V]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in vals {
        match (dt, *v) {
            (0, V::I(x)) => out.extend((x as i8).to_le_bytes()),
            (1, V::I(x)) => out.extend((x as u8).to_le_bytes()),
            (2, V::I(x)) => out.extend((x as i32).to_le_bytes()),
            (3, V::I(x)) => out.extend((x as u32).to_le_bytes()),
            (4, V::I(x)) => out.extend((x as i64).to_le_bytes()),
            (5, V::I(x)) => out.extend((x as u64).to_le_bytes()),
            (6, V::F(x)) => out.extend(f16::from_f64(x).to_le_bytes()),
            (7, V::F(x)) => out.extend((x as f32).to_le_bytes()),
            (8, V::F(x)) => out.extend(x.to_le_bytes()),
            (9, V::F(x)) => out.extend(bf16::from_f64(x).to_le_bytes()),
            other => panic!("bad value {other:?}"),
        }
    }
    out
}

pub fn decode(dt: c_int, bytes: &[u8]) -> Vec<V> {
    let size = DTYPES[dt as usize].2;
    bytes
        .chunks_exact(size)
        .map(|b| match dt {
            0 => V::I(i8::from_le_bytes([b[0]]) as i128),
            1 => V::I(b[0] as i128),
            2 => V::I(i32::from_le_bytes(b.try_into().unwrap()) as i128),
            3 => V::I(u32::from_le_bytes(b.try_into().unwrap()) as i128),
            4 => V::I(i64::from_le_bytes(b.try_into().unwrap()) as i128),
            5 => V::I(u64::from_le_bytes(b.try_into().unwrap()) as i128),
            6 => V::F(f16::from_le_bytes([b[0], b[1]]).to_f64()),
            7 => V::F(f32::from_le_bytes(b.try_into().unwrap()) as f64),
            8 => V::F(f64::from_le_bytes(b.try_into().unwrap())),
            9 => V::F(bf16::from_le_bytes([b[0], b[1]]).to_f64()),
            _ => unreachable!(),
        })
        .collect()
}

/// RCCL's result for one element: ranks combined in rank order, every step rounded (floats)
/// or wrapped (integers); avg = floats pre-multiplied by 1/n (rounded to the type), integers
/// summed then divided (truncating).
pub fn reference(dt: c_int, op: c_int, xs: &[V]) -> V {
    let n = xs.len();
    if is_float(dt) {
        // RCCL's scalar: 1/n in double, through float for every type but float64.
        let scale = if dt == 8 {
            1.0 / n as f64
        } else {
            round(dt, (1.0f64 / n as f64) as f32 as f64)
        };
        let pre = |v: V| match v {
            V::F(x) if op == 4 => round(dt, x * scale),
            V::F(x) => x,
            V::I(_) => unreachable!(),
        };
        let mut acc = pre(xs[0]);
        for v in &xs[1..] {
            let y = pre(*v);
            acc = round(
                dt,
                match op {
                    0 | 4 => acc + y,
                    1 => acc * y,
                    2 => acc.max(y),
                    3 => acc.min(y),
                    _ => unreachable!(),
                },
            );
        }
        V::F(acc)
    } else {
        let get = |v: V| match v {
            V::I(x) => x,
            V::F(_) => unreachable!(),
        };
        let mut acc = get(xs[0]);
        for v in &xs[1..] {
            let y = get(*v);
            acc = wrap(
                dt,
                match op {
                    0 | 4 => acc.wrapping_add(y),
                    1 => acc.wrapping_mul(y),
                    2 => acc.max(y),
                    3 => acc.min(y),
                    _ => unreachable!(),
                },
            );
        }
        V::I(if op == 4 { acc / n as i128 } else { acc })
    }
}
