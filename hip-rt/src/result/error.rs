//! `hipGetLastError` / `hipPeekAtLastError`.

use super::hip_fn;
use super::Result;

/// `hipGetLastError`: the last error of this thread's HIP calls (including asynchronous launch
/// failures), resetting it to success.
pub fn get_last() -> Result<()> {
    let f = hip_fn!(hipGetLastError)?;
    // SAFETY: takes no arguments; reads and resets thread-local runtime state.
    unsafe { f() }.result()
}

/// `hipPeekAtLastError`: like [`get_last`] without resetting.
pub fn peek_last() -> Result<()> {
    let f = hip_fn!(hipPeekAtLastError)?;
    // SAFETY: takes no arguments; reads thread-local runtime state.
    unsafe { f() }.result()
}
