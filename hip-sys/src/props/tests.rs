use super::layouts::{LegacyProps, PropsR0600};
use super::*;
use std::mem::offset_of;

/// Write `bytes` at `off` in `buf`.
fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

/// A buffer for `layout` with a plausible gfx906 device written at the given offsets.
struct Offsets {
    name: usize,
    arch: usize,
    total_global_mem: usize,
    warp_size: usize,
    multi_processor_count: usize,
    max_threads_per_block: usize,
}

fn device_buffer(layout: PropsLayout, o: &Offsets) -> Vec<u8> {
    let mut buf = new_buffer(layout);
    put(&mut buf, o.name, b"Hygon Z100L\0");
    put(&mut buf, o.arch, b"gfx906:sramecc+:xnack-\0");
    put(&mut buf, o.total_global_mem, &(32usize << 30).to_ne_bytes());
    put(&mut buf, o.warp_size, &64i32.to_ne_bytes());
    put(&mut buf, o.multi_processor_count, &60i32.to_ne_bytes());
    put(&mut buf, o.max_threads_per_block, &1024i32.to_ne_bytes());
    buf
}

/// R0600 offsets as recorded in DTK-NOTES (independent of our mirror struct).
const R0600_NOTES: Offsets = Offsets {
    name: 0,
    arch: 1160,
    total_global_mem: 288,
    warp_size: 308,
    multi_processor_count: 388,
    max_threads_per_block: 320,
};

/// Legacy offsets as recorded in DTK-NOTES and the 5.2 header (maxThreadsPerBlock follows
/// regsPerBlock and warpSize: 256 + 8 + 8 + 4 + 4 = 280).
const LEGACY_NOTES: Offsets = Offsets {
    name: 0,
    arch: 396,
    total_global_mem: 256,
    warp_size: 276,
    multi_processor_count: 336,
    max_threads_per_block: 280,
};

#[test]
fn layout_sizes_match_the_headers() {
    assert_eq!(PropsLayout::Legacy.size(), 792);
    assert_eq!(PropsLayout::R0600.size(), 1472);
}

#[test]
fn r0600_offsets_match_dtk_notes() {
    assert_eq!(offset_of!(PropsR0600, totalGlobalMem), 288);
    assert_eq!(offset_of!(PropsR0600, warpSize), 308);
    assert_eq!(offset_of!(PropsR0600, maxThreadsPerBlock), 320);
    assert_eq!(offset_of!(PropsR0600, multiProcessorCount), 388);
    assert_eq!(offset_of!(PropsR0600, gcnArchName), 1160);
}

#[test]
fn legacy_offsets_match_dtk_notes() {
    assert_eq!(offset_of!(LegacyProps, totalGlobalMem), 256);
    assert_eq!(offset_of!(LegacyProps, warpSize), 276);
    assert_eq!(offset_of!(LegacyProps, multiProcessorCount), 336);
    assert_eq!(offset_of!(LegacyProps, gcnArchName), 396);
}

/// The hand-written legacy mirror against bindgen's layout of the 5.2 header's
/// `hipDeviceProp_t` (whose own const assertions check it against clang's layout).
#[cfg(not(feature = "bindgen"))]
#[test]
fn legacy_mirror_matches_bindgen_layout() {
    use crate::generated::hipDeviceProp_t as H;
    macro_rules! same {
        ($($f:ident),*) => {$(
            assert_eq!(offset_of!(LegacyProps, $f), offset_of!(H, $f), stringify!($f));
        )*};
    }
    assert_eq!(size_of::<LegacyProps>(), size_of::<H>());
    same!(
        name,
        totalGlobalMem,
        sharedMemPerBlock,
        regsPerBlock,
        warpSize,
        maxThreadsPerBlock,
        maxThreadsDim,
        maxGridSize,
        clockRate,
        memoryClockRate,
        memoryBusWidth,
        totalConstMem,
        major,
        minor,
        multiProcessorCount,
        l2CacheSize,
        maxThreadsPerMultiProcessor,
        computeMode,
        clockInstructionRate,
        arch,
        concurrentKernels,
        pciDomainID,
        pciBusID,
        pciDeviceID,
        maxSharedMemoryPerMultiProcessor,
        isMultiGpuBoard,
        canMapHostMemory,
        gcnArch,
        gcnArchName,
        integrated,
        cooperativeLaunch,
        cooperativeMultiDeviceLaunch,
        maxTexture1DLinear,
        maxTexture1D,
        maxTexture2D,
        maxTexture3D,
        hdpMemFlushCntl,
        hdpRegFlushCntl,
        memPitch,
        textureAlignment,
        texturePitchAlignment,
        kernelExecTimeoutEnabled,
        ECCEnabled,
        tccDriver,
        isLargeBar,
        asicRevision,
        managedMemory,
        pageableMemoryAccessUsesHostPageTables
    );
}

/// Fill the bindgen-generated 5.2 struct field by field, take its bytes, decode as Legacy.
#[cfg(not(feature = "bindgen"))]
#[test]
fn decodes_a_struct_laid_out_by_the_5_2_header() {
    use crate::generated::hipDeviceProp_t as H;
    // Zeroed, 8-aligned storage viewed as the header's struct: every byte (padding included) is
    // initialised, so the bytes can be read back afterwards.
    let mut words = vec![0u64; BUFFER_SIZE / 8];
    // SAFETY: `words` is 8-aligned, larger than H, and all-zero bytes are a valid H (integers,
    // arrays, a bitfield unit and null pointers); the borrow ends before `words` is read.
    let p = unsafe { &mut *words.as_mut_ptr().cast::<H>() };
    for (dst, src) in p.name.iter_mut().zip(b"AMD Radeon VII") {
        *dst = *src as std::ffi::c_char;
    }
    for (dst, src) in p.gcnArchName.iter_mut().zip(b"gfx906:sramecc+:xnack-") {
        *dst = *src as std::ffi::c_char;
    }
    p.totalGlobalMem = 16 << 30;
    p.sharedMemPerBlock = 65536;
    p.regsPerBlock = 65536;
    p.warpSize = 64;
    p.maxThreadsPerBlock = 1024;
    p.maxThreadsDim = [1024, 1024, 1024];
    p.maxGridSize = [i32::MAX, 65536, 65536];
    p.clockRate = 1_801_000;
    p.memoryClockRate = 1_000_000;
    p.memoryBusWidth = 4096;
    p.major = 9;
    p.minor = 0;
    p.multiProcessorCount = 60;
    p.l2CacheSize = 4 << 20;
    p.maxThreadsPerMultiProcessor = 2560;
    p.pciDomainID = 1;
    p.pciBusID = 0x43;
    p.pciDeviceID = 2;
    p.maxSharedMemoryPerMultiProcessor = 65536;
    p.integrated = 0;
    p.isLargeBar = 1;
    p.asicRevision = 1;
    let mut buf = new_buffer(PropsLayout::Legacy);
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    buf[..size_of::<H>()].copy_from_slice(&bytes[..size_of::<H>()]);
    let d = decode(&buf, PropsLayout::Legacy).unwrap();
    assert_eq!(d.name, "AMD Radeon VII");
    assert_eq!(d.gcn_arch_name, "gfx906:sramecc+:xnack-");
    assert_eq!(d.arch(), "gfx906");
    assert_eq!(d.total_global_mem, 16 << 30);
    assert_eq!(d.shared_mem_per_block, 65536);
    assert_eq!(d.regs_per_block, 65536);
    assert_eq!(d.warp_size, 64);
    assert_eq!(d.max_threads_per_block, 1024);
    assert_eq!(d.max_threads_dim, [1024, 1024, 1024]);
    assert_eq!(d.max_grid_size, [i32::MAX, 65536, 65536]);
    assert_eq!(d.clock_rate_khz, 1_801_000);
    assert_eq!(d.memory_bus_width_bits, 4096);
    assert_eq!((d.major, d.minor), (9, 0));
    assert_eq!(d.multi_processor_count, 60);
    assert_eq!(d.l2_cache_size, 4 << 20);
    assert_eq!(d.max_threads_per_multi_processor, 2560);
    assert_eq!(
        (d.pci_domain_id, d.pci_bus_id, d.pci_device_id),
        (1, 0x43, 2)
    );
    assert_eq!(d.max_shared_memory_per_multi_processor, 65536);
    assert!(!d.integrated && d.is_large_bar);
    assert_eq!(d.layout, PropsLayout::Legacy);
    d.sanity_check().unwrap();
}

#[test]
fn decodes_both_layouts_from_notes_offsets() {
    for (layout, offsets) in [
        (PropsLayout::Legacy, &LEGACY_NOTES),
        (PropsLayout::R0600, &R0600_NOTES),
    ] {
        let buf = device_buffer(layout, offsets);
        let d = decode(&buf, layout).unwrap();
        assert_eq!(d.name, "Hygon Z100L", "{layout}");
        assert_eq!(d.gcn_arch_name, "gfx906:sramecc+:xnack-", "{layout}");
        assert_eq!(d.total_global_mem, 32 << 30, "{layout}");
        assert_eq!(d.warp_size, 64, "{layout}");
        assert_eq!(d.multi_processor_count, 60, "{layout}");
        assert_eq!(d.max_threads_per_block, 1024, "{layout}");
        d.sanity_check().unwrap();
        check_canary(&buf, layout).unwrap();
    }
}

#[test]
fn wrong_layout_fails_the_sanity_check() {
    // An R0600 buffer read as legacy: warpSize comes from the wrong bytes.
    let buf = device_buffer(PropsLayout::R0600, &R0600_NOTES);
    let err = match decode(&buf, PropsLayout::Legacy) {
        Ok(d) => d.sanity_check().unwrap_err(),
        Err(e) => e,
    };
    assert!(!err.is_empty());
    // A legacy buffer read as R0600: the arch string at 1160 is in the canary area.
    let buf = device_buffer(PropsLayout::Legacy, &LEGACY_NOTES);
    let mut padded = buf.clone();
    padded.truncate(PropsLayout::R0600.size());
    let result = decode(&padded, PropsLayout::R0600).and_then(|d| d.sanity_check());
    assert!(result.is_err());
}

#[test]
fn sanity_check_names_the_bad_value() {
    let buf = device_buffer(PropsLayout::Legacy, &LEGACY_NOTES);
    let mut d = decode(&buf, PropsLayout::Legacy).unwrap();
    d.warp_size = 48;
    assert!(d.sanity_check().unwrap_err().contains("48"));
    d.warp_size = 32;
    d.sanity_check().unwrap();
    d.gcn_arch_name.clear();
    assert!(d.sanity_check().unwrap_err().contains("gcnArchName"));
}

#[test]
fn short_buffer_and_unterminated_string_are_errors() {
    assert!(decode(&[0u8; 100], PropsLayout::Legacy)
        .unwrap_err()
        .contains("shorter"));
    let mut buf = device_buffer(PropsLayout::Legacy, &LEGACY_NOTES);
    buf[..256].fill(b'x');
    assert!(decode(&buf, PropsLayout::Legacy)
        .unwrap_err()
        .contains("no NUL"));
}

#[test]
fn canary_catches_a_larger_struct() {
    let mut buf = new_buffer(PropsLayout::Legacy);
    check_canary(&buf, PropsLayout::Legacy).unwrap();
    buf[PropsLayout::Legacy.size() + 10] = 0;
    let err = check_canary(&buf, PropsLayout::Legacy).unwrap_err();
    assert!(err.contains("803"), "{err}");
}

/// A compiled probe: the C compiler's `offsetof` on the installed 5.2 header against our mirror.
/// Skips (with the reason) when there is no C compiler or no HIP header.
#[test]
fn legacy_offsets_match_a_compiled_probe() {
    let header = std::path::Path::new("/usr/include/hip/hip_runtime_api.h");
    if !header.is_file() {
        eprintln!(
            "skipped: {} not installed (apt-get install libamdhip64-dev)",
            header.display()
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("hip-sys-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    let fields = [
        ("totalGlobalMem", offset_of!(LegacyProps, totalGlobalMem)),
        ("warpSize", offset_of!(LegacyProps, warpSize)),
        ("maxGridSize", offset_of!(LegacyProps, maxGridSize)),
        (
            "multiProcessorCount",
            offset_of!(LegacyProps, multiProcessorCount),
        ),
        ("pciDomainID", offset_of!(LegacyProps, pciDomainID)),
        (
            "maxSharedMemoryPerMultiProcessor",
            offset_of!(LegacyProps, maxSharedMemoryPerMultiProcessor),
        ),
        ("gcnArchName", offset_of!(LegacyProps, gcnArchName)),
        ("isLargeBar", offset_of!(LegacyProps, isLargeBar)),
    ];
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <hip/hip_runtime_api.h>\nint main(void) {\n  printf(\"size %zu\\n\", sizeof(hipDeviceProp_t));\n",
    );
    for (f, _) in &fields {
        c.push_str(&format!(
            "  printf(\"{f} %zu\\n\", offsetof(hipDeviceProp_t, {f}));\n"
        ));
    }
    c.push_str("  return 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let compiled = std::process::Command::new("cc")
        .args(["-D__HIP_PLATFORM_AMD__", "-o"])
        .arg(&exe)
        .arg(&src)
        .output();
    let compiled = match compiled {
        Ok(out) if out.status.success() => out,
        Ok(out) => panic!(
            "probe failed to compile: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => {
            eprintln!("skipped: no C compiler (`cc`): {e}");
            return;
        }
    };
    drop(compiled);
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let value = |key: &str| -> usize {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{key} missing from probe output:\n{text}"))
    };
    assert_eq!(value("size "), PropsLayout::Legacy.size());
    for (f, ours) in fields {
        assert_eq!(value(&format!("{f} ")), ours, "{f}");
    }
}

#[test]
fn preferred_layout_per_flavour() {
    use crate::Flavour;
    assert_eq!(preferred_layout(Flavour::Rocm, true), PropsLayout::R0600);
    assert_eq!(preferred_layout(Flavour::Rocm, false), PropsLayout::Legacy);
    assert_eq!(preferred_layout(Flavour::Dtk, true), PropsLayout::Legacy);
    assert_eq!(preferred_layout(Flavour::Dtk, false), PropsLayout::Legacy);
}
