//! Group calls: several communicators driven from one thread (`ncclGroupStart`/`ncclGroupEnd`).
//!
//! RCCL queues the collectives called inside a group only at `ncclGroupEnd`, so hip-rt records
//! their completion events then, on the streams they were called with. Those streams must live
//! until the group ends (RCCL itself queues the work on them there): with [`group`], streams
//! borrowed by the closure always do.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::Arc;

use hip_sys::hipStream_t;

use super::communicator::Inner;
use super::{call, rccl};
use crate::error::Result;
use crate::stream::Stream;

thread_local! {
    /// Open groups on this thread (RCCL nests them).
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Collectives called inside the open group, to track once it ends.
    static DEFERRED: RefCell<Vec<(Arc<Inner>, &'static str, hipStream_t)>> = const { RefCell::new(Vec::new()) };
}

/// Inside a group: remember `op` on `stream` for when the group ends and return true.
pub(crate) fn defer(inner: &Arc<Inner>, op: &'static str, stream: &Stream) -> bool {
    if DEPTH.with(Cell::get) == 0 {
        return false;
    }
    DEFERRED.with(|d| d.borrow_mut().push((inner.clone(), op, stream.raw())));
    true
}

/// An open group (`ncclGroupStart`); [`GroupGuard::end`] or `Drop` ends it. Not `Send`: RCCL's
/// groups belong to the thread that opened them.
#[must_use = "the group ends when the guard is dropped"]
pub struct GroupGuard {
    ended: bool,
    _thread: PhantomData<*const ()>,
}

impl GroupGuard {
    /// `ncclGroupStart`.
    pub fn start() -> Result<GroupGuard> {
        let lib = rccl("ncclGroupStart", 0)?;
        let f = call("ncclGroupStart", 0, lib.api().ncclGroupStart())?;
        // SAFETY: ncclGroupStart takes no arguments.
        call("ncclGroupStart", 0, unsafe { f() }.result())?;
        DEPTH.with(|d| d.set(d.get() + 1));
        Ok(GroupGuard {
            ended: false,
            _thread: PhantomData,
        })
    }

    /// `ncclGroupEnd`: the grouped collectives are queued on their streams (not completed).
    pub fn end(mut self) -> Result<()> {
        self.ended = true;
        end_group()
    }
}

impl Drop for GroupGuard {
    /// Ends the group if [`GroupGuard::end`] was not called; an error there is recorded on the
    /// devices of the grouped communicators ([`Device::check_err`](crate::Device::check_err)).
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let mut devices: Vec<crate::Device> = Vec::new();
        DEFERRED.with(|d| {
            for (inner, _, _) in d.borrow().iter() {
                if !devices.iter().any(|e| e.same_as(&inner.device)) {
                    devices.push(inner.device.clone());
                }
            }
        });
        if let Err(e) = end_group() {
            for device in devices {
                device.record_drop_error(Err(e.clone()));
            }
        }
    }
}

fn end_group() -> Result<()> {
    let depth = DEPTH.with(|d| {
        let v = d.get().saturating_sub(1);
        d.set(v);
        v
    });
    let deferred = if depth == 0 {
        DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()))
    } else {
        Vec::new()
    };
    let lib = rccl("ncclGroupEnd", 0)?;
    let f = call("ncclGroupEnd", 0, lib.api().ncclGroupEnd())?;
    // SAFETY: ncclGroupEnd takes no arguments.
    call("ncclGroupEnd", 0, unsafe { f() }.result())?;
    let mut first_err = Ok(());
    for (inner, op, stream) in deferred {
        // SAFETY: RCCL has just queued `op` on `stream` at ncclGroupEnd, so the stream is alive
        // (see the module docs); it belongs to `inner`'s device (checked when `op` was called).
        let r = unsafe { inner.record_raw(op, stream) };
        if first_err.is_ok() {
            first_err = r;
        }
    }
    first_err
}

/// Run `f` inside a group: `ncclGroupStart`, `f`, `ncclGroupEnd` (also when `f` fails). The
/// collectives `f` calls are queued when the group ends; [`Comm::wait`](super::Comm::wait) waits
/// for them.
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    let guard = GroupGuard::start()?;
    let result = f();
    let end = guard.end();
    let value = result?;
    end.map(|()| value)
}
