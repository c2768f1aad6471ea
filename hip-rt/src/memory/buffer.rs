//! [`DeviceBuffer`] and its borrow-checked views [`DeviceSlice`] / [`DeviceSliceMut`].

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::{Bound, Range, RangeBounds};

use bytemuck::Pod;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{DevicePtr, DeviceRepr, KernelArg};
use crate::memory::alloc::{RawAllocation, RawStream};
use crate::stream::Stream;

/// Element types a device buffer may hold: plain data with the same meaning on both sides.
pub trait Element: Pod + DeviceRepr {}
impl<T: Pod + DeviceRepr> Element for T {}

/// `len` elements of `T` in bytes, or [`Error::SizeOverflow`].
pub fn byte_len<T>(len: usize) -> Result<usize> {
    let elem_bytes = std::mem::size_of::<T>();
    len.checked_mul(elem_bytes)
        .ok_or(Error::SizeOverflow { len, elem_bytes })
}

/// Resolve a range against a length: the checked version of slice indexing.
pub fn resolve_range(range: impl RangeBounds<usize>, len: usize) -> Result<Range<usize>> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(start), Some(end)) if start <= end && end <= len => Ok(start..end),
        (s, e) => Err(Error::OutOfBounds {
            start: s.unwrap_or(usize::MAX),
            end: e.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// Typed device memory holding `len` values of `T`, allocated through its device's allocator.
///
/// Zero-length buffers allocate nothing and make no HIP call. Dropping returns the memory to the
/// allocator on the allocation stream; an error there is recorded on the device
/// ([`Device::check_err`]), never a panic.
pub struct DeviceBuffer<T: Element> {
    /// Kept as a field so that kernel arguments can point at it.
    ptr: DevicePtr,
    len: usize,
    allocation: Option<RawAllocation>,
    stream: RawStream,
    device: Device,
    _elem: PhantomData<T>,
}

impl<T: Element> DeviceBuffer<T> {
    /// `len` elements of unspecified (but valid: `T` is `Pod`) content, for use on `stream`.
    pub fn alloc(stream: &Stream, len: usize) -> Result<Self> {
        let device = stream.device().clone();
        let bytes = byte_len::<T>(len)?;
        let allocation = if bytes == 0 {
            None
        } else {
            device.bind_to_thread()?;
            Some(device.allocator().allocate(bytes, stream.id())?)
        };
        Ok(DeviceBuffer {
            ptr: allocation.map_or(DevicePtr::NULL, |a| a.ptr),
            len,
            allocation,
            stream: stream.id(),
            device,
            _elem: PhantomData,
        })
    }

    /// `len` zeroed elements (the memset is queued on `stream`).
    pub fn zeroed(stream: &Stream, len: usize) -> Result<Self> {
        let mut buf = Self::alloc(stream, len)?;
        stream.memset_zero(&mut buf)?;
        Ok(buf)
    }

    /// A buffer holding a copy of `data` (returns once the copy is complete).
    pub fn from_slice(stream: &Stream, data: &[T]) -> Result<Self> {
        let mut buf = Self::alloc(stream, data.len())?;
        stream.copy_htod(data, &mut buf)?;
        Ok(buf)
    }

    /// Copy the contents back to a `Vec` (waits for `stream`).
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        stream.copy_dtoh(self, &mut out)?;
        Ok(out)
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of element 0 (null for a zero-length buffer).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The stream the buffer was allocated on (and is freed on).
    pub fn stream_id(&self) -> RawStream {
        self.stream
    }

    /// A shared view of `range`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let r = resolve_range(range, self.len)?;
        Ok(DeviceSlice {
            ptr: elem_ptr::<T>(self.ptr, r.start),
            len: r.len(),
            owner: self,
        })
    }

    /// An exclusive view of `range`.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let r = resolve_range(range, self.len)?;
        Ok(DeviceSliceMut {
            ptr: elem_ptr::<T>(self.ptr, r.start),
            len: r.len(),
            owner: self,
            _excl: PhantomData,
        })
    }

    /// Exclusive views of `chunk` elements each, in order (the last one shorter when `chunk`
    /// does not divide the length), like `<[T]>::chunks_mut`: e.g. one view per layer of a
    /// gradient buffer. A `chunk` of 0 is [`Error::ZeroChunk`] (std panics).
    pub fn chunks_mut(&mut self, chunk: usize) -> Result<ChunksMut<'_, T>> {
        ChunksMut::new(self.ptr, self.len, chunk, self)
    }

    /// Two disjoint exclusive views: `..mid` and `mid..`. A `mid` past the end is
    /// [`Error::OutOfBounds`] (std's `split_at_mut` panics; nothing here does on bad input).
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        resolve_range(..mid, self.len)?;
        let (base, len, owner) = (self.ptr, self.len, &*self);
        let left = DeviceSliceMut {
            ptr: base,
            len: mid,
            owner,
            _excl: PhantomData,
        };
        let right = DeviceSliceMut {
            ptr: elem_ptr::<T>(base, mid),
            len: len - mid,
            owner,
            _excl: PhantomData,
        };
        Ok((left, right))
    }

    /// Tell the allocator this buffer is used by work on `stream`, so its memory is not reused
    /// before that work completes. hip-rt's copies call this for you; call it yourself when a
    /// kernel on another stream than the allocation stream uses the buffer.
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        match self.allocation {
            Some(a) if stream.id() != self.stream => {
                self.device.allocator().record_stream(&a, stream.id())
            }
            _ => Ok(()),
        }
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if let Some(allocation) = self.allocation.take() {
            let r = self.device.bind_to_thread().and_then(|()| {
                // SAFETY: `allocation` came from this device's allocator in `alloc`, is returned
                // exactly once (taken out of the Option), and this buffer is gone afterwards.
                unsafe { self.device.allocator().deallocate(allocation, self.stream) }
            });
            self.device.record_drop_error(r);
        }
    }
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>({} elems at {:#x} on device {})",
            std::any::type_name::<T>(),
            self.len,
            self.ptr.0,
            self.device.ordinal()
        )
    }
}

fn elem_ptr<T>(base: DevicePtr, index: usize) -> DevicePtr {
    // In bounds by construction (index <= len, len * size fits), so no overflow.
    base.byte_add(index.saturating_mul(std::mem::size_of::<T>()))
}

/// A shared view of part of a [`DeviceBuffer`].
#[derive(Clone, Copy)]
pub struct DeviceSlice<'a, T: Element> {
    ptr: DevicePtr,
    len: usize,
    owner: &'a DeviceBuffer<T>,
}

/// An exclusive view of part of a [`DeviceBuffer`]: the only way to write through it while the
/// view lives.
pub struct DeviceSliceMut<'a, T: Element> {
    ptr: DevicePtr,
    len: usize,
    owner: &'a DeviceBuffer<T>,
    _excl: PhantomData<&'a mut T>,
}

impl<'a, T: Element> DeviceSlice<'a, T> {
    /// A narrower view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'a, T>> {
        let r = resolve_range(range, self.len)?;
        Ok(DeviceSlice {
            ptr: elem_ptr::<T>(self.ptr, r.start),
            len: r.len(),
            owner: self.owner,
        })
    }
}

impl<'a, T: Element> DeviceSliceMut<'a, T> {
    /// A narrower exclusive view, borrowing this one.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let r = resolve_range(range, self.len)?;
        Ok(DeviceSliceMut {
            ptr: elem_ptr::<T>(self.ptr, r.start),
            len: r.len(),
            owner: self.owner,
            _excl: PhantomData,
        })
    }

    /// Two disjoint exclusive views of this one, `..mid` and `mid..`, borrowing it (like
    /// `<[T]>::split_at_mut`). A `mid` past the end is [`Error::OutOfBounds`] naming the range
    /// and the length, as [`DeviceBuffer::split_at_mut`]; std panics there, hip-rt never
    /// panics on bad input.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        resolve_range(..mid, self.len)?;
        let left = DeviceSliceMut {
            ptr: self.ptr,
            len: mid,
            owner: self.owner,
            _excl: PhantomData,
        };
        let right = DeviceSliceMut {
            ptr: elem_ptr::<T>(self.ptr, mid),
            len: self.len - mid,
            owner: self.owner,
            _excl: PhantomData,
        };
        Ok((left, right))
    }

    /// Two disjoint exclusive views, `..mid` and `mid..`, that take over this one (keeping its
    /// lifetime, so that a buffer can be carved into consecutive views in a loop). A `mid` past
    /// the end is [`Error::OutOfBounds`], as [`DeviceSliceMut::split_at_mut`].
    pub fn into_split_at(
        self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'a, T>, DeviceSliceMut<'a, T>)> {
        resolve_range(..mid, self.len)?;
        let left = DeviceSliceMut {
            ptr: self.ptr,
            len: mid,
            owner: self.owner,
            _excl: PhantomData,
        };
        let right = DeviceSliceMut {
            ptr: elem_ptr::<T>(self.ptr, mid),
            len: self.len - mid,
            owner: self.owner,
            _excl: PhantomData,
        };
        Ok((left, right))
    }

    /// Exclusive views of `chunk` elements each, in order, borrowing this one (like
    /// `<[T]>::chunks_mut`; the last view is shorter when `chunk` does not divide the length).
    /// A `chunk` of 0 is [`Error::ZeroChunk`] (std panics).
    pub fn chunks_mut(&mut self, chunk: usize) -> Result<ChunksMut<'_, T>> {
        ChunksMut::new(self.ptr, self.len, chunk, self.owner)
    }
}

/// The iterator of [`DeviceBuffer::chunks_mut`] and [`DeviceSliceMut::chunks_mut`]: disjoint
/// exclusive views of at most `chunk` elements, front to back.
pub struct ChunksMut<'a, T: Element> {
    ptr: DevicePtr,
    len: usize,
    chunk: usize,
    owner: &'a DeviceBuffer<T>,
    _excl: PhantomData<&'a mut T>,
}

impl<'a, T: Element> ChunksMut<'a, T> {
    fn new(ptr: DevicePtr, len: usize, chunk: usize, owner: &'a DeviceBuffer<T>) -> Result<Self> {
        if chunk == 0 {
            return Err(Error::ZeroChunk);
        }
        Ok(ChunksMut {
            ptr,
            len,
            chunk,
            owner,
            _excl: PhantomData,
        })
    }
}

impl<'a, T: Element> Iterator for ChunksMut<'a, T> {
    type Item = DeviceSliceMut<'a, T>;

    fn next(&mut self) -> Option<DeviceSliceMut<'a, T>> {
        if self.len == 0 {
            return None;
        }
        let n = self.chunk.min(self.len);
        // Each view covers elements no other view of this iterator covers, and the iterator
        // holds the exclusive borrow they came from for 'a: the views are exclusive.
        let view = DeviceSliceMut {
            ptr: self.ptr,
            len: n,
            owner: self.owner,
            _excl: PhantomData,
        };
        self.ptr = elem_ptr::<T>(self.ptr, n);
        self.len -= n;
        Some(view)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len.div_ceil(self.chunk);
        (n, Some(n))
    }
}

impl<T: Element> ExactSizeIterator for ChunksMut<'_, T> {}

mod sealed {
    pub trait Sealed {}
}

/// Device memory that can be read: [`DeviceBuffer`], [`DeviceSlice`], [`DeviceSliceMut`].
/// Sealed: only hip-rt's types, whose pointer and length are right by construction.
pub trait DeviceView<T: Element>: sealed::Sealed {
    /// The device address of the first element.
    fn device_ptr(&self) -> DevicePtr;
    /// The number of elements.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The buffer the view belongs to.
    fn buffer(&self) -> &DeviceBuffer<T>;
    /// The view's bytes.
    fn byte_len(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
    /// The elements `range` of this view (indices relative to it), as a narrower shared view;
    /// callable on a `&dyn DeviceView` (a launcher working on row chunks of its arguments).
    /// A range past the end is [`Error::OutOfBounds`].
    fn sub_view(&self, range: Range<usize>) -> Result<DeviceSlice<'_, T>> {
        let r = resolve_range(range, self.len())?;
        Ok(DeviceSlice {
            ptr: elem_ptr::<T>(self.device_ptr(), r.start),
            len: r.len(),
            owner: self.buffer(),
        })
    }
}

/// Device memory that can be written: a `&mut DeviceBuffer` or a [`DeviceSliceMut`].
pub trait DeviceViewMut<T: Element>: DeviceView<T> {
    /// The elements `range` of this view, as a narrower exclusive view borrowing this one
    /// (as [`DeviceSliceMut::slice_mut`], callable on a `&mut dyn DeviceViewMut`).
    fn sub_view_mut(&mut self, range: Range<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let r = resolve_range(range, self.len())?;
        Ok(DeviceSliceMut {
            ptr: elem_ptr::<T>(self.device_ptr(), r.start),
            len: r.len(),
            owner: self.buffer(),
            _excl: PhantomData,
        })
    }
}

macro_rules! view_impls {
    ($ty:ty, [$($lt:lifetime)?], |$s:ident| $owner:expr) => {
        impl<$($lt,)? T: Element> sealed::Sealed for $ty {}
        impl<$($lt,)? T: Element> DeviceView<T> for $ty {
            fn device_ptr(&self) -> DevicePtr {
                self.ptr
            }
            fn len(&self) -> usize {
                self.len
            }
            fn buffer(&self) -> &DeviceBuffer<T> {
                let $s = self;
                $owner
            }
        }
        // SAFETY: `ptr` is a field of the view/buffer holding a device address (the kernel's
        // `T*` parameter); it lives and stays unchanged while the view is borrowed.
        unsafe impl<$($lt,)? T: Element> KernelArg for $ty {
            fn arg_ptr(&self) -> *const c_void {
                (&self.ptr as *const DevicePtr).cast()
            }
            fn arg_size(&self) -> usize {
                std::mem::size_of::<DevicePtr>()
            }
        }
    };
}
view_impls!(DeviceBuffer<T>, [], |s| s);
view_impls!(DeviceSlice<'a, T>, ['a], |s| s.owner);
view_impls!(DeviceSliceMut<'a, T>, ['a], |s| s.owner);
impl<T: Element> DeviceViewMut<T> for DeviceBuffer<T> {}
impl<T: Element> DeviceViewMut<T> for DeviceSliceMut<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::reversed_empty_ranges)] // a reversed range is the point of one case
    fn ranges_resolve_like_slice_indexing() {
        assert_eq!(resolve_range(.., 10).unwrap(), 0..10);
        assert_eq!(resolve_range(2..5, 10).unwrap(), 2..5);
        assert_eq!(resolve_range(2..=5, 10).unwrap(), 2..6);
        assert_eq!(resolve_range(..=9, 10).unwrap(), 0..10);
        assert_eq!(resolve_range(10.., 10).unwrap(), 10..10);
        assert_eq!(resolve_range(.., 0).unwrap(), 0..0);
        assert!(matches!(
            resolve_range(..=10, 10),
            Err(Error::OutOfBounds {
                start: 0,
                end: 11,
                len: 10
            })
        ));
        assert!(matches!(
            resolve_range(5..3, 10),
            Err(Error::OutOfBounds {
                start: 5,
                end: 3,
                ..
            })
        ));
        assert!(matches!(
            resolve_range(11.., 10),
            Err(Error::OutOfBounds {
                start: 11,
                end: 10,
                ..
            })
        ));
        assert!(matches!(
            resolve_range(..=usize::MAX, 10),
            Err(Error::OutOfBounds {
                end: usize::MAX,
                ..
            })
        ));
        let excluded_start = (Bound::Excluded(usize::MAX), Bound::Unbounded);
        assert!(resolve_range(excluded_start, 10).is_err());
    }

    #[test]
    fn byte_lengths_are_checked() {
        assert_eq!(byte_len::<f32>(3).unwrap(), 12);
        assert_eq!(byte_len::<half::bf16>(0).unwrap(), 0);
        assert!(matches!(
            byte_len::<u64>(usize::MAX / 4),
            Err(Error::SizeOverflow { elem_bytes: 8, .. })
        ));
        let msg = byte_len::<u64>(usize::MAX).unwrap_err().to_string();
        assert!(msg.contains("overflow"), "{msg}");
    }

    #[test]
    fn element_pointers_step_by_size() {
        assert_eq!(elem_ptr::<f32>(DevicePtr(1024), 3), DevicePtr(1036));
        assert_eq!(elem_ptr::<half::f16>(DevicePtr(1024), 3), DevicePtr(1030));
    }
}

#[cfg(test)]
#[path = "buffer_tests.rs"]
mod device_free_tests;
