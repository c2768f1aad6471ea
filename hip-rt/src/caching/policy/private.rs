//! Graph capture's private pools (PyTorch's `PrivatePool`): while a graph is captured on a
//! stream, that stream's requests are served from segments of a pool of the capture's own, and
//! a block of the pool freed during the capture returns to the pool, where the capture's later
//! requests on that stream reuse it (the replays run the captured work in the captured stream
//! order, so the reuse is stream-ordered exactly as in eager mode). After the capture the pool
//! serves nothing: its blocks, free or freed later, stay out of every other request, and its
//! segments are never released, until the graph is gone and the pool *dissolves* (its blocks
//! join the capture stream's ordinary cache, after the other streams the graph was launched on
//! have completed that work).
//!
//! A pool is a pseudo-stream: an index into the policy's `streams` (whose entry is the capture
//! stream, for marks and events) that no stream interns to, so the pool's blocks carry it as
//! their stream, their free keys sort apart from every stream's, and split and merge stay
//! inside the pool's segments as they stay inside a stream's.

use std::collections::VecDeque;

use super::keys::MAX_STREAMS;
use super::{backend_err, Grant, Policy, State, NONE};
use crate::caching::backend::{Backend, DevicePtr};
use crate::caching::error::AllocError;

/// One private pool.
struct Entry<E> {
    /// The pool's pseudo-stream id.
    sid: u32,
    /// The capture stream's interned id, which the blocks join when the pool dissolves.
    home: u32,
    /// Once the graph is gone: the events recorded on the other streams it was launched on,
    /// not yet known to have completed; the pool dissolves when none is left.
    closing: Option<Vec<E>>,
}

/// The private pools of one allocator.
pub(super) struct Pools<E> {
    entries: Vec<Entry<E>>,
    /// The pool of the capture under way, or [`NONE`].
    capturing: u32,
    /// Pseudo-stream ids of dissolved pools, reused by later captures.
    spare: Vec<u32>,
}

impl<E> Default for Pools<E> {
    fn default() -> Self {
        Pools {
            entries: Vec::new(),
            capturing: NONE,
            spare: Vec::new(),
        }
    }
}

impl<E> Pools<E> {
    /// True when `sid` is a private pool (open or closing).
    pub(super) fn is_private(&self, sid: u32) -> bool {
        self.entries.iter().any(|e| e.sid == sid)
    }

    /// The pool of the capture under way, or [`NONE`].
    pub(super) fn capturing(&self) -> u32 {
        self.capturing
    }

    /// True when a pool waits for events before it dissolves.
    pub(super) fn dissolving(&self) -> bool {
        self.entries.iter().any(|e| e.closing.is_some())
    }
}

impl<B: Backend> Policy<B> {
    /// Opens a private pool for a capture on `stream` and returns its id.
    pub fn open_private(&mut self, stream: B::Stream) -> Result<u32, AllocError> {
        let home = self.stream_id(stream)?;
        let sid = match self.private.spare.pop() {
            Some(sid) => {
                self.streams[sid as usize] = stream;
                sid
            }
            None => {
                let next = self.streams.len() as u32;
                if next >= MAX_STREAMS {
                    return Err(AllocError::TooManyStreams {
                        device: self.device,
                        limit: MAX_STREAMS as usize,
                    });
                }
                self.streams.push(stream);
                self.pending.push(VecDeque::new());
                next
            }
        };
        self.private.entries.push(Entry {
            sid,
            home,
            closing: None,
        });
        self.private.capturing = sid;
        Ok(sid)
    }

    /// The capture has ended: its pool serves no request until it dissolves.
    pub fn end_private(&mut self) {
        self.private.capturing = NONE;
    }

    /// Allocates from private pool `sid` (the capture stream's requests during its capture).
    pub fn malloc_private(
        &mut self,
        size: usize,
        sid: u32,
        indexed: bool,
    ) -> Result<Grant, AllocError> {
        self.malloc_on(size, sid, indexed)
    }

    /// True when block `id` belongs to private pool `sid` and was used on no other stream:
    /// freed during the capture, it returns to the pool for the capture's later requests.
    pub fn reusable_in(&self, id: u32, sid: u32) -> bool {
        self.blocks
            .get(id as usize)
            .is_some_and(|b| b.stream == sid && b.stream_uses.is_empty())
    }

    /// True when block `id` lies in private pool `sid`.
    pub fn in_pool(&self, id: u32, sid: u32) -> bool {
        self.blocks
            .get(id as usize)
            .is_some_and(|b| b.stream == sid)
    }

    /// Bytes of the segments private pool `sid` reserved, and their count.
    pub fn private_segments(&self, sid: u32) -> (usize, usize) {
        self.blocks
            .iter()
            .filter(|b| b.state != State::Vacant && b.stream == sid)
            .fold((0, 0), |(bytes, n), b| {
                (bytes + b.size, n + usize::from(b.prev == NONE))
            })
    }

    /// The graph of private pool `sid` is gone; it was launched on `others` besides the capture
    /// stream. The pool dissolves now, or once events recorded on `others` now have completed
    /// (queried at later requests). If an event cannot be recorded, waits for the device
    /// instead; if even that fails, the pool never dissolves (its memory is never reused) and
    /// the error is returned.
    pub fn close_private(&mut self, sid: u32, others: &[B::Stream]) -> Result<(), AllocError> {
        if self.private.capturing == sid {
            self.private.capturing = NONE;
        }
        let Some(i) = self.private.entries.iter().position(|e| e.sid == sid) else {
            return Ok(());
        };
        let mut events = Vec::new();
        for &stream in others {
            match self.backend.record_event(stream) {
                Ok(event) => events.push(event),
                Err(e) => {
                    for event in events {
                        self.backend.recycle_event(event);
                    }
                    if self.backend.synchronize_device().is_ok() {
                        self.dissolve(i);
                    }
                    return Err(backend_err("record_event", self.device)(e));
                }
            }
        }
        if events.is_empty() {
            self.dissolve(i);
        } else {
            self.private.entries[i].closing = Some(events);
        }
        Ok(())
    }

    /// Dissolves the closing pools whose events have completed; with `wait`, waits for them.
    pub(super) fn poll_dissolving(&mut self, wait: bool) -> Result<(), AllocError> {
        let mut i = 0;
        while i < self.private.entries.len() {
            let backend = &mut self.backend;
            let ready = match &mut self.private.entries[i].closing {
                None => false,
                Some(events) => {
                    while let Some(event) = events.last() {
                        let done = if wait {
                            backend.event_synchronize(event).map(|()| true)
                        } else {
                            backend.event_query(event)
                        }
                        .map_err(backend_err("event_query", self.device))?;
                        if !done {
                            break;
                        }
                        if let Some(event) = events.pop() {
                            backend.recycle_event(event);
                        }
                    }
                    events.is_empty()
                }
            };
            if ready {
                self.dissolve(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Moves every block of pool `entries[i]` to its capture stream: free blocks become
    /// reusable there (and free for the memory checker, after the work queued on it), the
    /// others when their owners free them.
    fn dissolve(&mut self, i: usize) {
        let Entry { sid, home, .. } = self.private.entries.swap_remove(i);
        let stream = self.streams[home as usize];
        for id in 0..self.blocks.len() as u32 {
            let b = &self.blocks[id as usize];
            if b.state == State::Vacant || b.stream != sid {
                continue;
            }
            if b.state == State::Free {
                let (addr, size) = (DevicePtr(b.addr), b.size);
                self.remove_free(id);
                self.blocks[id as usize].stream = home;
                self.insert_free(id);
                self.backend.mark(addr, size, false, Some(stream));
            } else {
                self.blocks[id as usize].stream = home;
            }
        }
        self.private.spare.push(sid);
    }
}
