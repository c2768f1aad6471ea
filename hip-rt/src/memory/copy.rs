//! Copies and memsets, as methods of [`Stream`].
//!
//! Lengths must match exactly ([`Error::LengthMismatch`] otherwise); zero-length operations
//! return at once without calling HIP. Views of buffers from another device are rejected
//! ([`Error::WrongDevice`]). When the stream is not a buffer's allocation stream, the buffer's
//! allocator is told ([`record_stream`](crate::DeviceBuffer::record_stream)).

use std::ffi::c_void;

use crate::error::{Error, Result};
use crate::memory::buffer::{DeviceView, DeviceViewMut, Element};
use crate::memory::pinned::PinnedHostBuffer;
use crate::result;
use crate::stream::Stream;

impl Stream {
    /// Copy host memory to the device and wait for the copy (and earlier work on this stream).
    /// `src` may be any host memory.
    pub fn copy_htod<T: Element>(&self, src: &[T], dst: &mut impl DeviceViewMut<T>) -> Result<()> {
        if !self.prepare("copy_htod", dst.len(), src.len(), &[dst.buffer().device()])? {
            return Ok(());
        }
        dst.buffer().record_stream(self)?;
        // SAFETY: `dst` is a live device view of exactly `byte_len` bytes (checked equal to
        // `src`), `src` a live host slice; we synchronize below, before `src` can be released.
        unsafe {
            result::memory::copy_htod_async(
                dst.device_ptr(),
                src.as_ptr().cast(),
                dst.byte_len(),
                self.raw(),
            )
        }?;
        self.synchronize()
    }

    /// Copy device memory to the host, waiting for it (and earlier work on this stream).
    pub fn copy_dtoh<T: Element>(&self, src: &impl DeviceView<T>, dst: &mut [T]) -> Result<()> {
        if !self.prepare("copy_dtoh", dst.len(), src.len(), &[src.buffer().device()])? {
            return Ok(());
        }
        src.buffer().record_stream(self)?;
        // SAFETY: equal lengths checked; `dst` is exclusively borrowed host memory that nothing
        // reads until the synchronize below returns; `src` is a live device view.
        unsafe {
            result::memory::copy_dtoh_async(
                dst.as_mut_ptr().cast(),
                src.device_ptr(),
                src.byte_len(),
                self.raw(),
            )
        }?;
        self.synchronize()
    }

    /// Queue a device-to-device copy (returns without waiting).
    pub fn copy_dtod<T: Element>(
        &self,
        src: &(impl DeviceView<T> + ?Sized),
        dst: &mut impl DeviceViewMut<T>,
    ) -> Result<()> {
        let devices = [src.buffer().device(), dst.buffer().device()];
        if !self.prepare("copy_dtod", dst.len(), src.len(), &devices)? {
            return Ok(());
        }
        src.buffer().record_stream(self)?;
        dst.buffer().record_stream(self)?;
        // SAFETY: both are live device views of equal byte length; their buffers outlive the
        // queued copy because freeing is stream-ordered (record_stream above) or, for the direct
        // allocator, waits for the device.
        unsafe {
            result::memory::copy_dtod_async(
                dst.device_ptr(),
                src.device_ptr(),
                src.byte_len(),
                self.raw(),
            )
        }?;
        Ok(())
    }

    /// Queue a copy from pinned host memory (returns without waiting; the pinned buffer waits
    /// for it before any host access or free). If an earlier async copy still uses `src`, this
    /// first waits for it on the host.
    pub fn copy_htod_async<T: Element>(
        &self,
        src: &PinnedHostBuffer<T>,
        dst: &mut impl DeviceViewMut<T>,
    ) -> Result<()> {
        if !self.prepare(
            "copy_htod_async",
            dst.len(),
            src.len(),
            &[dst.buffer().device()],
        )? {
            return Ok(());
        }
        src.wait()?;
        dst.buffer().record_stream(self)?;
        src.track_copy(self, || {
            // SAFETY: equal lengths checked; `src` is pinned memory that `track_copy` keeps from
            // being written or freed until the copy completes; `dst` a live device view.
            unsafe {
                result::memory::copy_htod_async(
                    dst.device_ptr(),
                    src.host_ptr() as *const c_void,
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            Ok(())
        })
    }

    /// Queue a copy of the first `dst.len()` elements of pinned host memory (`src` may be
    /// longer: a staging buffer allocated once for the longest content it will hold, as the
    /// trainer's ring of micro-batch slots is). Otherwise as [`Stream::copy_htod_async`];
    /// `dst` longer than `src` is [`Error::LengthMismatch`].
    pub fn copy_htod_async_prefix<T: Element>(
        &self,
        src: &PinnedHostBuffer<T>,
        dst: &mut impl DeviceViewMut<T>,
    ) -> Result<()> {
        let n = dst.len();
        // The prefix copied: a mismatch only when `src` is shorter than `dst`.
        let src_len = n.min(src.len());
        if !self.prepare(
            "copy_htod_async_prefix",
            n,
            src_len,
            &[dst.buffer().device()],
        )? {
            return Ok(());
        }
        src.wait()?;
        dst.buffer().record_stream(self)?;
        src.track_copy(self, || {
            // SAFETY: `dst.len() <= src.len()` checked above (so `byte_len` bytes of `src` are
            // readable); `src` is pinned memory that `track_copy` keeps from being written or
            // freed until the copy completes; `dst` a live device view.
            unsafe {
                result::memory::copy_htod_async(
                    dst.device_ptr(),
                    src.host_ptr() as *const c_void,
                    dst.byte_len(),
                    self.raw(),
                )
            }?;
            Ok(())
        })
    }

    /// Queue a copy into pinned host memory (returns without waiting; reading the pinned buffer
    /// waits for it).
    pub fn copy_dtoh_async<T: Element>(
        &self,
        src: &impl DeviceView<T>,
        dst: &mut PinnedHostBuffer<T>,
    ) -> Result<()> {
        if !self.prepare(
            "copy_dtoh_async",
            dst.len(),
            src.len(),
            &[src.buffer().device()],
        )? {
            return Ok(());
        }
        dst.wait()?;
        src.buffer().record_stream(self)?;
        let host = dst.host_ptr().cast::<c_void>();
        dst.track_copy(self, || {
            // SAFETY: equal lengths checked; `dst` is pinned memory, exclusively borrowed here,
            // that `track_copy` keeps from being read, written or freed until the copy
            // completes; `src` is a live device view.
            unsafe {
                result::memory::copy_dtoh_async(host, src.device_ptr(), src.byte_len(), self.raw())
            }?;
            Ok(())
        })
    }

    /// Queue setting every byte of `dst` to `value`.
    pub fn memset_bytes<T: Element>(
        &self,
        dst: &mut (impl DeviceViewMut<T> + ?Sized),
        value: u8,
    ) -> Result<()> {
        if !self.prepare("memset", dst.len(), dst.len(), &[dst.buffer().device()])? {
            return Ok(());
        }
        dst.buffer().record_stream(self)?;
        // SAFETY: `dst` is a live, exclusively borrowed device view of `byte_len` bytes.
        unsafe {
            result::memory::memset_d8_async(dst.device_ptr(), value, dst.byte_len(), self.raw())
        }?;
        Ok(())
    }

    /// Queue zeroing `dst`.
    pub fn memset_zero<T: Element>(
        &self,
        dst: &mut (impl DeviceViewMut<T> + ?Sized),
    ) -> Result<()> {
        self.memset_bytes(dst, 0)
    }

    /// Check lengths and devices; `Ok(false)` means there is nothing to do (zero length).
    /// Copy between buffers of two devices (`hipMemcpyPeerAsync` on this stream, which must
    /// belong to one of them); peer access need not be enabled.
    ///
    /// # Host sync
    /// Waits for the copy (and earlier work on this stream): a buffer's allocator orders frees
    /// only against streams of the buffer's own device, so the other device's buffer could
    /// otherwise be reused while the copy still runs.
    pub fn copy_peer<T: Element>(
        &self,
        src: &impl DeviceView<T>,
        dst: &mut impl DeviceViewMut<T>,
    ) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::LengthMismatch {
                op: "copy_peer",
                dst: dst.len(),
                src: src.len(),
            });
        }
        let (s, d) = (src.buffer().device(), dst.buffer().device());
        if self.check_same_device("buffer", s).is_err() {
            self.check_same_device("buffer", d)?;
        }
        if dst.len() == 0 {
            return Ok(());
        }
        // SAFETY: live views of equal byte length on the devices named; both stay borrowed
        // until the synchronize below returns, after the copy.
        unsafe {
            result::memory::copy_peer_async(
                dst.device_ptr(),
                d.ordinal(),
                src.device_ptr(),
                s.ordinal(),
                src.byte_len(),
                self.raw(),
            )
        }?;
        self.synchronize()
    }

    fn prepare(
        &self,
        op: &'static str,
        dst: usize,
        src: usize,
        devices: &[&crate::Device],
    ) -> Result<bool> {
        if dst != src {
            return Err(Error::LengthMismatch { op, dst, src });
        }
        for device in devices {
            self.check_same_device("buffer", device)?;
        }
        Ok(dst != 0)
    }
}
