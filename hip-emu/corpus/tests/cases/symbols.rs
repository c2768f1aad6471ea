//! The C API's symbol calls as a C++ client makes them (`hipMemcpyToSymbol(HIP_SYMBOL(mask),
//! ...)`), through hip-sys's raw bindings: on hip-emu the symbol is the variable's address in the
//! module's host build (what `dlsym` gives), or the device address `hipModuleGetGlobal` returned.

use std::ffi::{c_void, CStr, CString};

use hip_sys::{hipError_t, hipMemcpyKind};

use super::{cfg1 as cfg, close, data, start};

/// The address of variable `name` in the loaded host build of kernels/`source`.hip: hip-emu's
/// `HIP_SYMBOL(name)`.
fn host_symbol(source: &str, name: &str) -> *const c_void {
    let image = hip_emu_corpus::bundle(source).expect("the corpus is built");
    let key = hip_codeobj::emu::host_key(image).expect("a host key");
    // hip-emu picked the file (the newest of the build directories holding the key): find the
    // one this process mapped.
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let file = format!("/{key}.so");
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with(&file))
        .unwrap_or_else(|| panic!("hip-emu has loaded no `{file}`"))
        .to_string();
    let c_path = CString::new(path.clone()).unwrap();
    // SAFETY: dlopen with a valid C string; RTLD_NOLOAD only finds the object hip-emu loaded
    // and loads nothing.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "{path} is loaded by hip-emu");
    let c_name = CString::new(name).unwrap();
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    assert!(!sym.is_null(), "{name} in {path}");
    sym.cast_const()
}

/// hipGetErrorString of `code` (hip-emu appends the detail of this thread's last error).
fn message(code: hipError_t) -> String {
    let text = hip_sys::sym!(hipGetErrorString).expect("exported");
    // SAFETY: hipGetErrorString returns a static NUL-terminated string.
    unsafe { CStr::from_ptr(text(code)) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_constant_table_written_by_symbol_is_what_the_kernel_reads() {
    let Some(e) = start() else { return };
    let to_symbol = hip_sys::sym!(hipMemcpyToSymbol).expect("exported");
    let from_symbol = hip_sys::sym!(hipMemcpyFromSymbol).expect("exported");
    let size_of = hip_sys::sym!(hipGetSymbolSize).expect("exported");
    let address_of = hip_sys::sym!(hipGetSymbolAddress).expect("exported");
    let n = 70;
    let x = data(n, 31);
    let module = e.module("constant_mask");
    let f = module.function("convolution_constant").unwrap();
    let mask = host_symbol("constant_mask", "mask");

    let mut size = 0usize;
    // SAFETY: a valid out-pointer; `mask` is the variable's host address.
    let r = unsafe { size_of(&mut size, mask) };
    assert_eq!(r, hipError_t::hipSuccess);
    assert_eq!(size, 5 * 4, "__constant__ float mask[5]");

    let dx = e.upload(&x);
    let weights = [0.5f32, -0.25, 2.0, 0.125, 1.0];
    // SAFETY: 20 bytes from a live array into the 20-byte variable.
    let r = unsafe {
        to_symbol(
            mask,
            weights.as_ptr().cast(),
            20,
            0,
            hipMemcpyKind::hipMemcpyHostToDevice,
        )
    };
    assert_eq!(r, hipError_t::hipSuccess, "{}", message(r));
    // One element rewritten at an offset.
    let last = 3.0f32;
    // SAFETY: 4 bytes into bytes 16..20 of the variable.
    let r = unsafe {
        to_symbol(
            mask,
            (&raw const last).cast(),
            4,
            16,
            hipMemcpyKind::hipMemcpyHostToDevice,
        )
    };
    assert_eq!(r, hipError_t::hipSuccess, "{}", message(r));
    let weights = [0.5f32, -0.25, 2.0, 0.125, 3.0];

    let mut dy = e.upload(&vec![0f32; n]);
    // SAFETY: (const float* in, float* out, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dy)
            .value(n as i32)
            .launch(&cfg(2, 64, 0))
    }
    .unwrap();
    let want: Vec<f64> = (0..n as i64)
        .map(|i| {
            (0..5i64)
                .filter(|j| (0..n as i64).contains(&(i + j - 2)))
                .map(|j| f64::from(x[(i + j - 2) as usize]) * f64::from(weights[j as usize]))
                .sum()
        })
        .collect();
    close(
        &e.download(&dy),
        &want,
        1e-6,
        "convolution_constant by symbol",
    );

    // Read back by host symbol and by the device address (hipGetSymbolAddress and
    // hipModuleGetGlobal agree on it).
    let mut back = [0f32; 5];
    // SAFETY: 20 bytes of the variable into a 20-byte array.
    let r = unsafe {
        from_symbol(
            back.as_mut_ptr().cast(),
            mask,
            20,
            0,
            hipMemcpyKind::hipMemcpyDeviceToHost,
        )
    };
    assert_eq!(r, hipError_t::hipSuccess, "{}", message(r));
    assert_eq!(back, weights);
    let mut device = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { address_of(&mut device, mask) };
    assert_eq!(r, hipError_t::hipSuccess);
    let global = module.global::<f32>("mask").unwrap();
    assert_eq!(device as u64, global.device_ptr().0);
    let mut tail = [0f32; 2];
    // SAFETY: 8 bytes at offset 12 of the variable (named by its device address).
    let r = unsafe {
        from_symbol(
            tail.as_mut_ptr().cast(),
            device.cast_const(),
            8,
            12,
            hipMemcpyKind::hipMemcpyDeviceToHost,
        )
    };
    assert_eq!(r, hipError_t::hipSuccess, "{}", message(r));
    assert_eq!(tail, [0.125, 3.0]);

    // Past the end of the variable: an error naming it, nothing written.
    // SAFETY: the call is refused before any copy.
    let r = unsafe {
        to_symbol(
            mask,
            weights.as_ptr().cast(),
            20,
            4,
            hipMemcpyKind::hipMemcpyHostToDevice,
        )
    };
    assert_eq!(r, hipError_t::hipErrorInvalidValue);
    let text = message(r);
    assert!(text.contains("mask") && text.contains("offset 4"), "{text}");

    // A pointer that is no variable.
    let stray = [0u8; 4];
    let mut size = 0usize;
    // SAFETY: a valid out-pointer; the symbol is only compared, never read.
    let r = unsafe { size_of(&mut size, stray.as_ptr().cast()) };
    assert_eq!(r, hipError_t::hipErrorInvalidSymbol);
    let text = message(r);
    assert!(
        text.contains("not a variable") && text.contains("hipGetSymbolSize"),
        "{text}"
    );
}

/// `hipLaunchCooperativeKernel` of `f` on the test's stream, then a stream sync: the status of
/// the launch call, else of the sync.
fn launch_cooperative(
    e: &crate::Emu,
    f: &hip_rt::Function,
    grid: u32,
    block: u32,
    args: &mut [*mut c_void],
) -> hipError_t {
    let launch = hip_sys::sym!(hipLaunchCooperativeKernel).expect("exported");
    let dim = |x| hip_sys::generated::dim3 { x, y: 1, z: 1 };
    // SAFETY: `args` holds one pointer per kernel parameter, each to a value of its type, alive
    // until the stream is synchronised below.
    let r = unsafe {
        launch(
            f.raw().cast_const().cast(),
            dim(grid),
            dim(block),
            args.as_mut_ptr(),
            0,
            e.stream.raw(),
        )
    };
    if r != hipError_t::hipSuccess {
        return r;
    }
    match e.stream.synchronize() {
        Ok(()) => hipError_t::hipSuccess,
        Err(err) => {
            eprintln!("{err}");
            hipError_t::hipErrorLaunchFailure
        }
    }
}

#[test]
fn a_grid_sync_orders_the_blocks_of_a_cooperative_launch() {
    let Some(e) = start() else { return };
    let module = e.module("grid_sync");
    let f = module.function("grid_sum").unwrap();
    let (n, blocks) = (10_000usize, 12u32);
    let x = data(n, 40);
    let dx = e.upload(&x);
    let dp = e.upload(&vec![0f32; blocks as usize]);
    let dk = e.upload(&vec![0f32; blocks as usize]);
    let dout = e.upload(&[0f32]);
    let (mut px, mut pp, mut pk, mut po) = (
        dx.device_ptr().0,
        dp.device_ptr().0,
        dk.device_ptr().0,
        dout.device_ptr().0,
    );
    let mut n32 = n as i32;
    let mut args: Vec<*mut c_void> = vec![
        (&raw mut px).cast(),
        (&raw mut pp).cast(),
        (&raw mut pk).cast(),
        (&raw mut po).cast(),
        (&raw mut n32).cast(),
    ];
    let r = launch_cooperative(&e, &f, blocks, 128, &mut args);
    assert_eq!(r, hipError_t::hipSuccess, "{}", message(r));
    // Each partial is its block's grid-stride share; the total is their sum, read by block 0
    // only after every block wrote its partial (the grid sync).
    let grid_threads = blocks as usize * 128;
    let want_partial: Vec<f64> = (0..blocks as usize)
        .map(|b| {
            (0..n)
                .filter(|i| (i % grid_threads) / 128 == b)
                .map(|i| f64::from(x[i]))
                .sum()
        })
        .collect();
    let partial = e.download(&dp);
    close(&partial, &want_partial, 1e-4, "grid_sum partials");
    assert_eq!(
        e.download(&dk),
        partial,
        "each block's LDS survives the grid sync"
    );
    let total: f64 = x.iter().map(|v| f64::from(*v)).sum();
    // fp32 sums of 10^4 values of magnitude < 1: within 1e-3 absolute.
    close(&e.download(&dout), &[total], 1e-3, "grid_sum total");
}

#[test]
fn grid_sync_misuse_and_oversized_cooperative_grids_are_errors() {
    let Some(e) = start() else { return };
    let module = e.module("grid_sync");
    let f = module.function("grid_sum").unwrap();
    let dummy = e.upload(&vec![0f32; 64]);
    let mut p = dummy.device_ptr().0;
    let mut n = 0i32;
    let mut args: Vec<*mut c_void> = vec![
        (&raw mut p).cast(),
        (&raw mut p).cast(),
        (&raw mut p).cast(),
        (&raw mut p).cast(),
        (&raw mut n).cast(),
    ];
    // More blocks than the device holds at once (the occupancy model times 60 CUs).
    let occupancy = hip_sys::sym!(hipModuleOccupancyMaxActiveBlocksPerMultiprocessor).unwrap();
    let mut per_cu = 0;
    // SAFETY: a live function; a valid out-pointer.
    let r = unsafe { occupancy(&mut per_cu, f.raw(), 128, 0) };
    assert_eq!(r, hipError_t::hipSuccess);
    let r = launch_cooperative(&e, &f, per_cu as u32 * 60 + 1, 128, &mut args);
    assert_eq!(r, hipError_t::hipErrorCooperativeLaunchTooLarge);
    let text = message(r);
    assert!(
        text.contains("co-resident") && text.contains("grid_sum"),
        "{text}"
    );
    // Co-resident, but over hip-emu's bound on live fibres.
    let r = launch_cooperative(&e, &f, 129, 128, &mut args);
    assert_eq!(r, hipError_t::hipErrorCooperativeLaunchTooLarge);
    assert!(message(r).contains("16384"), "{}", message(r));

    // A grid sync in an ordinary launch.
    let mut out = e.upload(&[0f32; 4]);
    let g = module.function("grid_sync_after_exit").unwrap();
    // SAFETY: (float* out), 4 blocks of 64 threads.
    unsafe {
        e.stream
            .launch_builder(&g)
            .arg_mut(&mut out)
            .launch(&cfg(4, 64, 0))
    }
    .unwrap();
    let err = e.stream.synchronize().unwrap_err().to_string();
    assert!(
        err.contains("not cooperative") && err.contains("hipLaunchCooperativeKernel"),
        "{err}"
    );
    // A block that returned before the grid sync the others wait at.
    let mut po = out.device_ptr().0;
    let mut args: Vec<*mut c_void> = vec![(&raw mut po).cast()];
    let r = launch_cooperative(&e, &g, 4, 64, &mut args);
    assert_eq!(r, hipError_t::hipErrorLaunchFailure);
}
