//! [`UniqueId`]: the token every rank of one communicator must share.

use std::fmt;
use std::str::FromStr;

use hip_sys::rccl::{ncclUniqueId, NCCL_UNIQUE_ID_BYTES};

use super::error::CommError;
use super::{call, rccl};
use crate::error::Result;

/// An RCCL unique id (`ncclUniqueId`, 128 opaque bytes). Rank 0 creates it ([`UniqueId::new`])
/// and hands it to every other rank (as bytes or hex, e.g. through an environment variable or a
/// file) before each calls [`Comm::init_rank`](super::Comm::init_rank).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub(crate) ncclUniqueId);

impl UniqueId {
    /// A fresh id from `ncclGetUniqueId` (with real RCCL this opens a bootstrap socket on this
    /// host, which the other ranks connect to).
    pub fn new() -> Result<UniqueId> {
        let lib = rccl("ncclGetUniqueId", 0)?;
        let f = call("ncclGetUniqueId", 0, lib.api().ncclGetUniqueId())?;
        let mut id = ncclUniqueId::ZERO;
        // SAFETY: ncclGetUniqueId writes one ncclUniqueId through a valid pointer.
        let status = unsafe { f(&mut id) };
        call("ncclGetUniqueId", 0, status.result())?;
        Ok(UniqueId(id))
    }

    /// The id's 128 bytes.
    pub fn to_bytes(&self) -> [u8; NCCL_UNIQUE_ID_BYTES] {
        self.0.to_bytes()
    }

    /// An id from exactly 128 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, CommError> {
        let bytes: [u8; NCCL_UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            CommError::BadId(format!(
                "{} bytes given; an id is exactly {NCCL_UNIQUE_ID_BYTES}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(ncclUniqueId::from_bytes(bytes)))
    }

    /// The id as 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.to_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// An id from 256 hex digits (either case; surrounding whitespace is ignored).
    pub fn from_hex(text: &str) -> Result<UniqueId, CommError> {
        let text = text.trim();
        if text.len() != 2 * NCCL_UNIQUE_ID_BYTES {
            return Err(CommError::BadId(format!(
                "{} characters given; the hex form is exactly {} digits",
                text.len(),
                2 * NCCL_UNIQUE_ID_BYTES
            )));
        }
        let digit = |i: usize, c: u8| -> Result<u8, CommError> {
            (c as char).to_digit(16).map(|d| d as u8).ok_or_else(|| {
                CommError::BadId(format!(
                    "character {:?} at position {i} is not a hex digit",
                    c as char
                ))
            })
        };
        let raw = text.as_bytes();
        let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = digit(2 * i, raw[2 * i])? << 4 | digit(2 * i + 1, raw[2 * i + 1])?;
        }
        Ok(UniqueId(ncclUniqueId::from_bytes(bytes)))
    }
}

impl fmt::Display for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId({}..)", &self.to_hex()[..16])
    }
}

impl FromStr for UniqueId {
    type Err = CommError;
    fn from_str(s: &str) -> Result<UniqueId, CommError> {
        UniqueId::from_hex(s)
    }
}
