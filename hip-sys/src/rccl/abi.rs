//! RCCL's C ABI: types, enum values and the version code, written by hand from RCCL's public
//! header `nccl.h` (ROCm/rccl `src/nccl.h.in`; no RCCL header is installed here for bindgen).
//! Every value below is asserted in `tests.rs` against the numbers in that header:
//!
//! - `ncclUniqueId` is `struct { char internal[128]; }` (`NCCL_UNIQUE_ID_BYTES`), passed by value
//!   to `ncclCommInitRank`; `ncclComm_t` is an opaque pointer.
//! - `ncclResult_t`, `ncclDataType_t` and `ncclRedOp_t` are C enums (4 bytes). `ncclRemoteError`
//!   and `ncclInProgress` exist from NCCL 2.12-based releases on; `ncclAvg` from 2.10.
//! - `NCCL_VERSION(X,Y,Z)` is `X*1000 + Y*100 + Z` up to 2.8 and `X*10000 + Y*100 + Z` after.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_int};
use std::fmt;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: opaque bytes that every rank of one communicator must receive.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    /// All-zero bytes (not a valid id; `ncclGetUniqueId` fills one).
    pub const ZERO: ncclUniqueId = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };

    /// The id's bytes.
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.internal.map(|c| c as u8)
    }

    /// An id from its bytes.
    pub fn from_bytes(bytes: [u8; NCCL_UNIQUE_ID_BYTES]) -> ncclUniqueId {
        ncclUniqueId {
            internal: bytes.map(|b| b as c_char),
        }
    }
}

impl fmt::Debug for ncclUniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head: String = self.to_bytes()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        write!(f, "ncclUniqueId({head}..)")
    }
}

/// `ncclComm_t` (opaque).
pub type ncclComm_t = *mut std::ffi::c_void;

crate::blas::status_newtype! {
    /// `ncclResult_t`.
    ncclResult_t => RcclError ("RCCL") {
        ncclSuccess = 0,
        ncclUnhandledCudaError = 1,
        ncclSystemError = 2,
        ncclInternalError = 3,
        ncclInvalidArgument = 4,
        ncclInvalidUsage = 5,
        ncclRemoteError = 6,
        ncclInProgress = 7,
    }
    hints {
        ncclUnhandledCudaError => "a HIP call inside RCCL failed: check the device (hip-doctor) and that every rank's device is distinct and visible",
        ncclSystemError => "a system call failed (sockets, shared memory, /dev/shm size): check the network interfaces (NCCL_SOCKET_IFNAME) and /dev/shm",
        ncclInvalidArgument => "an argument is invalid (null or misaligned buffer, count, root or datatype out of range)",
        ncclInvalidUsage => "the calls do not match RCCL's rules (e.g. two ranks of one communicator on one device, or mismatched collectives across ranks)",
        ncclRemoteError => "another rank or process failed or exited: check the other ranks' logs",
    }
}

/// Declare a C-enum newtype (`c_int`) with its constants and header names.
macro_rules! c_enum {
    ($(#[$meta:meta])* $ty:ident { $($name:ident = $value:literal,)* }) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $ty(pub c_int);
        impl $ty {
            $(pub const $name: $ty = $ty($value);)*
            /// The header's name, or "unrecognized".
            pub fn name(self) -> &'static str {
                match self.0 {
                    $($value => stringify!($name),)*
                    _ => "unrecognized",
                }
            }
        }
    };
}

c_enum! {
    /// `ncclDataType_t` (the aliases `ncclChar`, `ncclInt`, `ncclHalf`, `ncclFloat`, `ncclDouble`
    /// share these numbers).
    ncclDataType_t {
        ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
        ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9,
    }
}

impl ncclDataType_t {
    /// Bytes per element, `None` for a value this crate does not know.
    pub fn size_bytes(self) -> Option<usize> {
        Some(match self.0 {
            0 | 1 => 1,
            6 | 9 => 2,
            2 | 3 | 7 => 4,
            4 | 5 | 8 => 8,
            _ => return None,
        })
    }
}

c_enum! {
    /// `ncclRedOp_t` (built-in operations; `ncclAvg` needs an NCCL >= 2.10-based release).
    ncclRedOp_t { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, }
}

/// A decoded `ncclGetVersion` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The integer the library returned.
    pub code: i32,
}

impl RcclVersion {
    /// Decode `code`: `X*10000 + Y*100 + Z` from NCCL 2.9 on (codes >= 10000), `X*1000 + Y*100 +
    /// Z` before. `None` for a code no release returns (zero or negative).
    pub fn decode(code: i32) -> Option<RcclVersion> {
        let v = u32::try_from(code).ok().filter(|&v| v > 0)?;
        let (major, rest) = if v >= 10_000 {
            (v / 10_000, v % 10_000)
        } else {
            (v / 1000, v % 1000)
        };
        Some(RcclVersion {
            major,
            minor: rest / 100,
            patch: rest % 100,
            code,
        })
    }

    /// Whether this is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether `op` exists in this release (`ncclAvg` arrived with NCCL 2.10).
    pub fn supports_op(&self, op: ncclRedOp_t) -> bool {
        op != ncclRedOp_t::ncclAvg || self.at_least(2, 10)
    }
}

impl fmt::Display for RcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}
