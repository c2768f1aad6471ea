//! A module's `__device__` / `__constant__` variable, typed: [`Module::global`].

use std::ffi::CString;
use std::marker::PhantomData;

use super::Module;
use crate::error::{Error, Result};
use crate::launch::DevicePtr;
use crate::memory::buffer::Element;
use crate::result;
use crate::stream::Stream;

/// A variable of a loaded module, seen as `len` values of `T` (a scalar is one). It keeps the
/// module loaded. Reads and writes go through `hipMemcpy*` on a stream and wait for it.
pub struct DeviceGlobal<T: Element> {
    module: Module,
    name: String,
    ptr: DevicePtr,
    len: usize,
    _t: PhantomData<T>,
}

impl Module {
    /// The module's variable `name` (its symbol, or its C++ name: `mask`, `ns::table`) as
    /// values of `T`. Its size in bytes must be a whole number of `T`s, else
    /// [`Error::GlobalSize`].
    pub fn global<T: Element>(&self, name: &str) -> Result<DeviceGlobal<T>> {
        let cname = CString::new(name).map_err(|_| Error::NulInName(name.to_owned()))?;
        self.inner.device.bind_to_thread()?;
        // SAFETY: the module is live while `self` is; `cname` is NUL-terminated.
        let (ptr, bytes) = unsafe { result::module::get_global(self.inner.raw, &cname) }?;
        let elem = std::mem::size_of::<T>();
        if elem == 0 || bytes % elem != 0 || bytes == 0 {
            return Err(Error::GlobalSize {
                name: name.to_owned(),
                bytes,
                elem,
                ty: std::any::type_name::<T>(),
            });
        }
        Ok(DeviceGlobal {
            module: self.clone(),
            name: name.to_owned(),
            ptr,
            len: bytes / elem,
            _t: PhantomData,
        })
    }
}

impl<T: Element> DeviceGlobal<T> {
    /// How many `T`s the variable holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// False: a variable has at least one value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its device address (what a kernel argument pointing at it would hold).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Writes `data` (exactly [`len`](Self::len) values) and waits for the copy.
    pub fn write(&self, stream: &Stream, data: &[T]) -> Result<()> {
        self.check_len(data.len())?;
        // SAFETY: the variable is `len * size_of::<T>()` bytes of device memory while the module
        // is loaded (held by self); `data` is that many readable bytes until the wait below.
        unsafe {
            result::memory::copy_htod_async(
                self.ptr,
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                stream.raw(),
            )
        }?;
        stream.synchronize()
    }

    /// Reads the variable and waits for the copy.
    pub fn read(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        // SAFETY: as in `write`; `out` is `len` writable values, untouched until the wait.
        unsafe {
            result::memory::copy_dtoh_async(
                out.as_mut_ptr().cast(),
                self.ptr,
                std::mem::size_of_val(out.as_slice()),
                stream.raw(),
            )
        }?;
        stream.synchronize()?;
        Ok(out)
    }

    fn check_len(&self, given: usize) -> Result<()> {
        if given == self.len {
            Ok(())
        } else {
            Err(Error::GlobalLength {
                name: self.name.clone(),
                len: self.len,
                given,
            })
        }
    }
}
