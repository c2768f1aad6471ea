use super::*;

const L: LaunchLimits = LaunchLimits::GFX906;

#[test]
fn for_num_elems_covers_every_element() {
    for (n, grid) in [
        (0u64, 1u32),
        (1, 1),
        (255, 1),
        (256, 1),
        (257, 2),
        (1 << 20, 4096),
    ] {
        let cfg = LaunchConfig::for_num_elems(n, &L).unwrap();
        assert_eq!(cfg.block, (256, 1, 1));
        assert_eq!(cfg.grid, (grid, 1, 1), "n = {n}");
        assert!(cfg.total_threads() >= u128::from(n));
        assert_eq!(cfg.waves_per_block(64), 4);
    }
    let cfg = LaunchConfig::for_num_elems_with_block(1000, 64, &L).unwrap();
    assert_eq!(cfg.grid, (16, 1, 1));
}

#[test]
fn for_num_elems_respects_small_devices_and_wave_size() {
    let small = LaunchLimits {
        max_threads_per_block: 200,
        max_block_dim: [200, 200, 64],
        ..L
    };
    // 256 capped to 200, then rounded down to a multiple of 64.
    assert_eq!(
        LaunchConfig::for_num_elems(1000, &small).unwrap().block,
        (192, 1, 1)
    );
    let wave32 = LaunchLimits {
        wavefront_size: 32,
        max_threads_per_block: 100,
        max_block_dim: [100; 3],
        ..L
    };
    assert_eq!(
        LaunchConfig::for_num_elems(1000, &wave32).unwrap().block,
        (96, 1, 1)
    );
}

#[test]
fn for_num_elems_rejects_bad_input() {
    assert_eq!(
        LaunchConfig::for_num_elems_with_block(10, 0, &L),
        Err(LaunchError::BadBlockSize {
            block_size: 0,
            max: 1024
        })
    );
    assert_eq!(
        LaunchConfig::for_num_elems_with_block(10, 2048, &L),
        Err(LaunchError::BadBlockSize {
            block_size: 2048,
            max: 1024
        })
    );
    let tiny_grid = LaunchLimits {
        max_grid_dim: [4, 1, 1],
        ..L
    };
    assert_eq!(
        LaunchConfig::for_num_elems_with_block(1025, 256, &tiny_grid),
        Err(LaunchError::TooManyElements {
            num_elems: 1025,
            block_size: 256,
            blocks: 5,
            max: 4
        })
    );
    // More blocks than u32 holds.
    assert!(matches!(
        LaunchConfig::for_num_elems_with_block(u64::MAX, 1, &L),
        Err(LaunchError::TooManyElements { .. })
    ));
}

#[test]
fn per_row_uses_whole_wavefronts() {
    let cfg = LaunchConfig::per_row(7, 4, &L).unwrap();
    assert_eq!((cfg.grid, cfg.block), ((7, 1, 1), (256, 1, 1)));
    assert!(matches!(
        LaunchConfig::per_row(7, 32, &L),
        Err(LaunchError::BlockTooLarge { threads: 2048, .. })
    ));
    assert!(matches!(
        LaunchConfig::per_row(0, 1, &L),
        Err(LaunchError::ZeroDim {
            what: "grid",
            axis: 'x',
            ..
        })
    ));
}

#[test]
fn validate_checks_each_limit() {
    let ok = LaunchConfig {
        grid: (10, 2, 3),
        block: (16, 16, 4),
        shared_mem_bytes: 65536,
    };
    assert_eq!(ok.validate(&L), Ok(()));
    assert_eq!(ok.num_blocks(), 60);
    assert_eq!(ok.threads_per_block(), 1024);

    let zero = LaunchConfig {
        block: (16, 0, 4),
        ..ok
    };
    assert_eq!(
        zero.validate(&L),
        Err(LaunchError::ZeroDim {
            what: "block",
            axis: 'y',
            dims: (16, 0, 4)
        })
    );
    let too_many = LaunchConfig {
        block: (16, 16, 8),
        ..ok
    };
    assert!(matches!(
        too_many.validate(&L),
        Err(LaunchError::BlockTooLarge {
            threads: 2048,
            max: 1024,
            ..
        })
    ));
    let narrow = LaunchLimits {
        max_block_dim: [1024, 1024, 2],
        ..L
    };
    assert_eq!(
        ok.validate(&narrow),
        Err(LaunchError::DimTooLarge {
            what: "block",
            axis: 'z',
            value: 4,
            max: 2
        })
    );
    let tall = LaunchConfig {
        grid: (1, 70000, 1),
        block: (1, 1, 1),
        shared_mem_bytes: 0,
    };
    assert_eq!(
        tall.validate(&L),
        Err(LaunchError::DimTooLarge {
            what: "grid",
            axis: 'y',
            value: 70000,
            max: 65536
        })
    );
    let wide = LaunchConfig {
        grid: (i32::MAX as u32, 1, 1),
        block: (4, 1, 1),
        shared_mem_bytes: 0,
    };
    assert!(matches!(
        wide.validate(&L),
        Err(LaunchError::GlobalSizeOverflow { axis: 'x', .. })
    ));
    let lds = ok.with_shared_mem(65537);
    assert_eq!(
        lds.validate(&L),
        Err(LaunchError::SharedMemTooLarge {
            requested: 65537,
            max: 65536
        })
    );
}

#[test]
fn launch_errors_name_the_value_and_the_fix() {
    let e = LaunchConfig::per_row(1, 32, &L).unwrap_err().to_string();
    assert!(
        e.contains("2048") && e.contains("1024") && e.contains("smaller blocks"),
        "{e}"
    );
    let e = LaunchConfig::for_num_elems_with_block(5, 0, &L)
        .unwrap_err()
        .to_string();
    assert!(e.contains("wavefront"), "{e}");
}

#[test]
fn kernel_args_keep_c_order_and_live_values() {
    let n: i32 = 42;
    let ptr = DevicePtr(0xdead_beef_0000);
    let scale = half::f16::from_f32(1.5);
    let mut args = KernelArgs::new();
    args.arg(&ptr).value(2.5f32).arg(&n).value(7u64).arg(&scale);
    assert_eq!(args.len(), 5);
    assert_eq!(args.arg_sizes(), &[8, 4, 4, 8, 2]);
    let raw = args.as_param_array();
    // SAFETY: `raw` points at 5 argument pointers, each to a live value of the pushed type.
    unsafe {
        assert_eq!(*(*raw).cast::<u64>(), 0xdead_beef_0000);
        assert_eq!(*(*raw.add(1)).cast::<f32>(), 2.5);
        assert_eq!(*(*raw.add(2)).cast::<i32>(), 42);
        assert_eq!(*(*raw.add(3)).cast::<u64>(), 7);
        assert_eq!(*(*raw.add(4)).cast::<half::f16>(), scale);
    }
    assert!(KernelArgs::new().is_empty());
}

#[test]
fn kernel_args_hold_large_and_over_aligned_values_across_a_move() {
    #[derive(Clone, Copy)]
    #[repr(C, align(16))]
    struct Wide([u32; 4]);
    // SAFETY: plain u32s, no padding (16 bytes, aligned 16).
    unsafe impl DeviceRepr for Wide {}
    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Table([u64; 100]);
    // SAFETY: plain u64s, no padding.
    unsafe impl DeviceRepr for Table {}

    let table = Table(std::array::from_fn(|i| i as u64 * 3));
    let mut args = KernelArgs::new();
    args.value(1u8)
        .value(table)
        .value(Wide([1, 2, 3, 4]))
        .value(-5i16);
    // The builder moves (as a LaunchBuilder does when returned); the array is built after.
    let mut moved = args;
    assert_eq!(moved.arg_sizes(), &[1, 800, 16, 2]);
    let raw = moved.as_param_array();
    // SAFETY: `raw` points at 4 argument pointers, each to a live value of the pushed type.
    unsafe {
        assert_eq!(*(*raw).cast::<u8>(), 1);
        let t = &*(*raw.add(1)).cast::<Table>();
        assert_eq!((t.0[0], t.0[99]), (0, 297));
        let w = *raw.add(2);
        assert_eq!(
            w as usize % 16,
            0,
            "over-aligned values keep their alignment"
        );
        assert_eq!((*w.cast::<Wide>()).0, [1, 2, 3, 4]);
        assert_eq!(*(*raw.add(3)).cast::<i16>(), -5);
    }
}

#[test]
fn device_ptr_round_trips() {
    let p = DevicePtr(4096);
    assert_eq!(DevicePtr::from_raw(p.as_raw()), p);
    assert_eq!(p.byte_add(16), DevicePtr(4112));
    assert!(DevicePtr::NULL.is_null());
    assert_eq!(DevicePtr(u64::MAX).byte_add(1), DevicePtr(u64::MAX));
}
