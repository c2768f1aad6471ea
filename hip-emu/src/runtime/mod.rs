//! The exported HIP runtime C ABI: devices, memory, streams, events, modules, launches, stream
//! capture and graphs.
//!
//! Every export runs inside [`error::guard`] (panics become hipErrorUnknown) and stores its
//! status as the thread's last error. Handles (streams, events, modules, functions) are opaque
//! numbers looked up in tables, never dereferenced, so a stale or made-up handle is
//! hipErrorInvalidHandle rather than undefined behaviour.
//!
//! Environment: see [`config`] (`HIPK_EMU_DEVICES`, `HIPK_EMU_MEMORY`, `HIPK_EMU_SEED`,
//! `HIPK_EMU_LAZY`).

pub mod api_device;
pub mod api_memory;
pub mod api_stream;
pub mod config;
pub mod device;
pub mod error;
pub mod globals;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod metadata;
pub mod module;
pub mod occupancy;
pub mod queue;
pub mod stats;
pub mod symbols;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use config::Config;
use device::Device;
use error::{Fail, Res};
use hip_sys::{hipError_t, hipEvent_t, hipStream_t};
use queue::{EventState, NULL_STREAM};

/// The process-wide emulator: configuration and devices, created on the first call.
pub struct Runtime {
    pub config: Config,
    pub devices: Vec<Device>,
    streams: Mutex<HashMap<usize, StreamInfo>>,
    events: Mutex<HashMap<usize, EventInfo>>,
    /// `(device, peer)` pairs with peer access enabled (`hipDeviceEnablePeerAccess` on `device`).
    peers: Mutex<HashSet<(i32, i32)>>,
}

/// A created stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamInfo {
    pub device: i32,
    pub id: u64,
    pub flags: u32,
    pub priority: i32,
}

/// A created event.
#[derive(Clone)]
pub struct EventInfo {
    pub device: i32,
    pub flags: u32,
    pub state: Arc<EventState>,
}

static RUNTIME: OnceLock<Res<Runtime>> = OnceLock::new();
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(0x1000);

/// A fresh opaque handle value (never 0, never reused).
pub fn new_handle() -> usize {
    NEXT_HANDLE.fetch_add(0x10, Ordering::Relaxed)
}

/// The emulator, initialised on first use (a bad environment is an error every time).
pub fn runtime() -> Res<&'static Runtime> {
    RUNTIME
        .get_or_init(|| {
            let config = Config::from_env()?;
            let devices = (0..config.devices as i32)
                .map(|d| Device::new(d, &config))
                .collect::<Res<Vec<_>>>()?;
            Ok(Runtime {
                config,
                devices,
                streams: Mutex::new(HashMap::new()),
                events: Mutex::new(HashMap::new()),
                peers: Mutex::new(HashSet::new()),
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl Runtime {
    /// Device `ordinal`, or hipErrorInvalidDevice.
    pub fn device(&self, ordinal: i32) -> Res<&Device> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or_else(|| {
                Fail::new(
                    hipError_t::hipErrorInvalidDevice,
                    format!(
                        "device {ordinal} does not exist: hip-emu has {} device(s) ({})",
                        self.devices.len(),
                        config::DEVICES_VAR
                    ),
                )
            })
    }

    /// This thread's current device.
    pub fn current(&self) -> Res<&Device> {
        self.device(device::current_ordinal())
    }

    /// The device and stream id behind `stream` (null: the current device's null stream).
    pub fn stream(&self, stream: hipStream_t) -> Res<(&Device, StreamInfo)> {
        if stream.is_null() {
            let dev = self.current()?;
            let info = StreamInfo {
                device: dev.ordinal,
                id: NULL_STREAM,
                flags: 0,
                priority: 0,
            };
            return Ok((dev, info));
        }
        let info = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(stream as usize))
            .copied()
            .ok_or_else(|| {
                Fail::handle(format!("stream {stream:p} is not a live stream of hip-emu"))
            })?;
        Ok((self.device(info.device)?, info))
    }

    pub fn add_stream(&self, info: StreamInfo) -> usize {
        let handle = new_handle();
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, info);
        handle
    }

    pub fn remove_stream(&self, stream: hipStream_t) -> Res<StreamInfo> {
        let (_, info) = self.stream(stream)?;
        if stream.is_null() {
            return Err(Fail::handle("the null stream cannot be destroyed"));
        }
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(stream as usize));
        Ok(info)
    }

    /// Enable (`on`) or disable access from `device` to `peer`'s memory. Fails with HIP's codes
    /// when it is already in the requested state.
    pub fn set_peer_access(&self, device: i32, peer: i32, on: bool) -> Res {
        self.device(device)?;
        self.device(peer)?;
        if device == peer {
            return Err(Fail::new(
                hipError_t::hipErrorInvalidDevice,
                format!("device {device} cannot be its own peer"),
            ));
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        match (on, peers.contains(&(device, peer))) {
            (true, true) => Err(Fail::new(
                hipError_t::hipErrorPeerAccessAlreadyEnabled,
                format!("access from device {device} to device {peer} is already enabled"),
            )),
            (false, false) => Err(Fail::new(
                hipError_t::hipErrorPeerAccessNotEnabled,
                format!("access from device {device} to device {peer} was not enabled"),
            )),
            (true, false) => {
                peers.insert((device, peer));
                Ok(())
            }
            (false, true) => {
                peers.remove(&(device, peer));
                Ok(())
            }
        }
    }

    /// True when work on `device` may touch `owner`'s memory (its own, or an enabled peer's).
    pub fn may_access(&self, device: i32, owner: i32) -> bool {
        device == owner
            || self
                .peers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&(device, owner))
    }

    pub fn event(&self, event: hipEvent_t) -> Res<EventInfo> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(event as usize))
            .cloned()
            .ok_or_else(|| Fail::handle(format!("event {event:p} is not a live event of hip-emu")))
    }

    pub fn add_event(&self, info: EventInfo) -> usize {
        let handle = new_handle();
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, info);
        handle
    }

    pub fn remove_event(&self, event: hipEvent_t) -> Res<()> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(event as usize))
            .map(|_| ())
            .ok_or_else(|| Fail::handle(format!("event {event:p} is not a live event of hip-emu")))
    }
}

/// Write `value` through the out-pointer `ptr`, or hipErrorInvalidValue if it is null.
///
/// # Safety
/// `ptr` must be null or valid for a write of `T` (the C API's out-parameter contract).
pub unsafe fn out<T>(ptr: *mut T, value: T, what: &str) -> Res {
    if ptr.is_null() {
        return Err(Fail::invalid(format!("{what} is a null pointer")));
    }
    // SAFETY: non-null, and valid for a write per the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Define `#[no_mangle] extern "C"` HIP entry points whose body returns [`error::Res`]; each
/// runs inside [`error::guard`].
macro_rules! hip_exports {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// The HIP C API contract of this function: pointer arguments are null or valid for
        /// the reads and writes HIP documents, for as long as HIP documents.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> hip_sys::hipError_t {
            $crate::runtime::error::guard(stringify!($name), || $body)
        }
    )*};
}
pub(crate) use hip_exports;
