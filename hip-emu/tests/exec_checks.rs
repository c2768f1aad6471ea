//! hip-emu executor: synchronisation semantics and the launch checks, on the test-only
//! kernels of tests/kernels/checks.hip (registered under `hipemu_test_*`).

mod common;

use common::{arg, available, launch, launch1, ptr, ptr_mut, within_a_minute, Guarded, Opts};
use hip_emu::exec::ExecError;

#[test]
fn barrier_exchanges_through_lds_in_every_block() {
    if !available() {
        return;
    }
    let (blocks, threads) = (3usize, 96usize);
    let input: Vec<i32> = (0..(blocks * threads) as i32).map(|i| i * 7 + 1).collect();
    let mut out = vec![0i32; blocks * threads];
    launch1(
        "hipemu_test_reverse",
        blocks as u32,
        threads as u32,
        &[ptr(input.as_ptr()), ptr(out.as_mut_ptr())],
    )
    .unwrap();
    for b in 0..blocks {
        for t in 0..threads {
            assert_eq!(
                out[b * threads + t],
                input[b * threads + threads - 1 - t],
                "block {b} thread {t}"
            );
        }
    }
}

#[test]
fn barriers_at_different_sites_are_a_deadlock_naming_both_lines() {
    if !available() {
        return;
    }
    let err = within_a_minute(|| {
        let mut out = vec![0i32; 128];
        launch1(
            "hipemu_test_barrier_divergence",
            2,
            128,
            &[ptr(out.as_mut_ptr())],
        )
        .unwrap_err()
    });
    let msg = err.to_string();
    assert!(matches!(err, ExecError::Deadlock { .. }), "{err:?}");
    assert!(
        msg.contains("hipemu_test_barrier_divergence") && msg.contains("block (0, 0, 0)"),
        "{msg}"
    );
    assert!(
        msg.contains("hip-emu/tests/kernels/checks.hip:23 (threads 1, 3, 5,")
            && msg.contains("hip-emu/tests/kernels/checks.hip:25 (threads 0, 2, 4,"),
        "{msg}"
    );
}

#[test]
fn a_barrier_after_some_threads_exited_is_an_error() {
    if !available() {
        return;
    }
    let err = within_a_minute(|| {
        let mut out = vec![0i32; 64];
        launch1(
            "hipemu_test_barrier_after_exit",
            1,
            64,
            &[ptr(out.as_mut_ptr())],
        )
        .unwrap_err()
    });
    let msg = err.to_string();
    assert!(matches!(err, ExecError::BarrierAfterExit { .. }), "{err:?}");
    assert!(
        msg.contains("checks.hip:33 waits") && msg.contains("threads 40-63"),
        "{msg}"
    );
}

#[test]
fn a_shuffle_in_a_divergent_branch_is_a_wave_divergence() {
    if !available() {
        return;
    }
    let err = within_a_minute(|| {
        let mut out = vec![0f32; 64];
        launch1(
            "hipemu_test_wave_divergence",
            1,
            64,
            &[ptr(out.as_mut_ptr())],
        )
        .unwrap_err()
    });
    let msg = err.to_string();
    assert!(
        matches!(err, ExecError::WaveDivergence { wave: 0, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("checks.hip:40 (lanes 0-15)") && msg.contains("exited (lanes 16-63)"),
        "{msg}"
    );
}

/// The reference of hipemu_test_wave_ops for one block of `n` threads.
fn wave_ops_reference(v: &[f32]) -> (Vec<f32>, [u64; 12]) {
    let n = v.len();
    let mut out = vec![0f32; 8 * n];
    let exists = |l: usize| l < n;
    let get = |l: usize| if exists(l) { v[l] } else { 0.0 };
    let mut ballots = [0u64; 12];
    for t in 0..n {
        let lane = t % 64;
        let w0 = t - lane;
        let o = &mut out[8 * t..8 * t + 8];
        o[0] = get(w0 + (lane ^ 1));
        o[1] = get(w0 + (lane ^ 32));
        o[2] = get(w0 + 5);
        // __shfl_down(v, 3, 16): lanes whose 16-lane segment has no lane +3 keep their own.
        o[3] = if (lane % 16) + 3 >= 16 {
            v[t]
        } else {
            get(t + 3)
        };
        // quad_perm [3, 2, 1, 0] (0x1B), bound_ctrl off, old 0.
        o[4] = get(w0 + (lane & !3) + (3 - (lane & 3)));
        // row_shr:1 (0x111): lane 0 of each row keeps old (-1).
        o[5] = if lane % 16 == 0 { -1.0 } else { get(t - 1) };
        o[6] = v[w0];
        let mut d = 0f64;
        for l in 0..64 {
            d += get(w0 + l) as f64;
        }
        o[7] = d as f32;
    }
    for w in 0..n.div_ceil(64) {
        let lanes = (w * 64)..((w * 64 + 64).min(n));
        ballots[w] = lanes
            .clone()
            .filter(|t| t % 3 == 0)
            .fold(0, |m, t| m | 1 << (t % 64));
        ballots[4 + w] = u64::from(lanes.clone().any(|t| t == 70));
        ballots[8 + w] = 1;
    }
    (out, ballots)
}

#[test]
fn wave_operations_exchange_among_64_lanes_and_inactive_lanes_read_zero() {
    if !available() {
        return;
    }
    // 160 threads: waves of 64, 64 and a partial third wave of 32 lanes.
    for n in [64usize, 160] {
        let v: Vec<f32> = (0..n).map(|i| (i * i % 97) as f32 + 0.5).collect();
        let mut out = vec![f32::NAN; 8 * n];
        let mut ballots = [0u64; 12];
        launch1(
            "hipemu_test_wave_ops",
            1,
            n as u32,
            &[
                ptr(v.as_ptr()),
                ptr(out.as_mut_ptr()),
                ptr(ballots.as_mut_ptr()),
            ],
        )
        .unwrap();
        let (want, want_ballots) = wave_ops_reference(&v);
        for t in 0..n {
            for k in 0..8 {
                let (g, w) = (out[8 * t + k], want[8 * t + k]);
                assert!(g == w, "n {n} thread {t} op {k}: got {g}, want {w}");
            }
        }
        assert_eq!(ballots, want_ballots, "n {n}");
    }
}

#[test]
fn lds_starts_every_block_as_nan_bytes() {
    if !available() {
        return;
    }
    for _block in 0..2 {
        let mut words = vec![0u32; 64];
        let mut floats = vec![0f32; 64];
        launch1(
            "hipemu_test_lds_fill",
            2,
            64,
            &[ptr(words.as_mut_ptr()), ptr(floats.as_mut_ptr())],
        )
        .unwrap();
        assert!(words.iter().all(|&w| w == 0xFFFF_FFFF), "{words:x?}");
        assert!(floats.iter().all(|f| f.is_nan()));
    }
}

#[test]
fn dynamic_lds_is_filled_exchanged_and_guarded() {
    if !available() {
        return;
    }
    let n = 100usize;
    let mut fill = vec![0u32; n];
    let mut out = vec![0i32; n];
    let args = [ptr(fill.as_mut_ptr()), ptr(out.as_mut_ptr()), arg(n as i32)];
    launch(
        "hipemu_test_dynamic_lds",
        [1, 1, 1],
        [128, 1, 1],
        &args,
        Opts {
            dynamic_lds: n * 4,
            ..Opts::default()
        },
    )
    .unwrap();
    assert!(fill.iter().all(|&w| w == 0xFFFF_FFFF));
    for (t, &o) in out.iter().enumerate() {
        assert_eq!(o, 3 * (n - 1 - t) as i32);
    }
    // Only 64 of the 100 ints requested: thread 64's access runs into the guard page.
    let err = launch(
        "hipemu_test_dynamic_lds",
        [1, 1, 1],
        [128, 1, 1],
        &args,
        Opts {
            dynamic_lds: 64 * 4,
            ..Opts::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::Fault { .. }), "{err:?}");
}

#[test]
fn an_out_of_bounds_read_into_a_guard_page_is_a_fault_naming_the_thread() {
    if !available() {
        return;
    }
    let buf = Guarded::<f32>::new(1000, 1.0);
    let mut sum = 0f32;
    launch1(
        "hipemu_test_read",
        1,
        64,
        &[ptr(buf.data), arg(1000i64), ptr_mut(&mut sum)],
    )
    .unwrap();
    assert_eq!(sum, 1000.0);
    let err = launch1(
        "hipemu_test_read",
        1,
        64,
        &[ptr(buf.data), arg(1001i64), ptr_mut(&mut sum)],
    )
    .unwrap_err();
    let ExecError::Fault {
        addr,
        thread,
        block,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!(*addr, buf.data as usize + 4000);
    assert_eq!((thread.0, block.0), ([0, 0, 0], [0, 0, 0]));
    let msg = err.to_string();
    assert!(
        msg.contains("hipemu_test_read") && msg.contains("SIGSEGV"),
        "{msg}"
    );
    // The executor still works after a fault.
    launch1(
        "hipemu_test_read",
        1,
        64,
        &[ptr(buf.data), arg(10i64), ptr_mut(&mut sum)],
    )
    .unwrap();
    assert_eq!(sum, 10.0);
}

#[test]
fn a_fibre_stack_overflow_is_a_fault_not_a_crash() {
    if !available() {
        return;
    }
    let mut out = vec![0i32; 64];
    let err = launch1(
        "hipemu_test_stack_overflow",
        1,
        64,
        &[ptr(out.as_mut_ptr()), arg(100_000i32)],
    )
    .unwrap_err();
    assert!(err.to_string().contains("stack overflow"), "{err}");
    launch1(
        "hipemu_test_stack_overflow",
        1,
        64,
        &[ptr(out.as_mut_ptr()), arg(3i32)],
    )
    .unwrap();
}

#[test]
fn three_dimensional_ids_are_those_of_a_device() {
    if !available() {
        return;
    }
    let (grid, block) = ([3u32, 2, 2], [4u32, 3, 2]);
    let nb = 24usize;
    let mut out = vec![0u32; 12 * nb];
    launch(
        "hipemu_test_ids",
        grid,
        block,
        &[ptr(out.as_mut_ptr())],
        Opts::default(),
    )
    .unwrap();
    for bz in 0..2 {
        for by in 0..2 {
            for bx in 0..3 {
                for tz in 0..2 {
                    for ty in 0..3 {
                        for tx in 0..4 {
                            let b = bx + 3 * (by + 2 * bz);
                            let t = tx + 4 * (ty + 3 * tz);
                            let want =
                                (bx << 24) | (by << 16) | (bz << 12) | (tx << 8) | (ty << 4) | tz;
                            assert_eq!(out[(b * 24 + t) as usize], want);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_seed_shuffles_the_block_order() {
    if !available() {
        return;
    }
    let run = |seed| {
        let mut order = vec![0u32; 50];
        let mut counter = 0u32;
        launch(
            "hipemu_test_block_order",
            [50, 1, 1],
            [64, 1, 1],
            &[ptr(order.as_mut_ptr()), ptr_mut(&mut counter)],
            Opts {
                seed,
                ..Opts::default()
            },
        )
        .unwrap();
        assert_eq!(counter, 50);
        order
    };
    assert_eq!(run(None), (0..50).collect::<Vec<_>>());
    let shuffled = run(Some(3));
    assert_ne!(shuffled, (0..50).collect::<Vec<_>>());
    let mut sorted = shuffled.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    assert_eq!(run(Some(3)), shuffled, "the same seed gives the same order");
}

#[test]
fn launch_configuration_checks() {
    if !available() {
        return;
    }
    let mut out = vec![0i32; 2048];
    let input = vec![0i32; 2048];
    let args = [ptr(input.as_ptr()), ptr(out.as_mut_ptr())];
    let err = launch1("hipemu_test_reverse", 1, 1025, &args).unwrap_err();
    assert!(
        matches!(
            err,
            ExecError::BlockTooLarge {
                threads: 1025,
                limit: 1024,
                ..
            }
        ),
        "{err:?}"
    );
    let err = launch(
        "hipemu_test_reverse",
        [1, 1, 1],
        [512, 1, 1],
        &args,
        Opts {
            max_flat: 256,
            ..Opts::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ExecError::BlockTooLarge {
                threads: 512,
                limit: 256,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("hipemu_test_reverse"), "{err}");
    let err = launch(
        "hipemu_test_reverse",
        [1, 1, 1],
        [64, 1, 1],
        &args,
        Opts {
            static_lds: 4096,
            dynamic_lds: 61441,
            ..Opts::default()
        },
    )
    .unwrap_err();
    assert!(
        matches!(err, ExecError::LdsTooLarge { total: 65537, .. }),
        "{err:?}"
    );
    launch(
        "hipemu_test_reverse",
        [1, 1, 1],
        [64, 1, 1],
        &args,
        Opts {
            static_lds: 4096,
            dynamic_lds: 61440,
            ..Opts::default()
        },
    )
    .unwrap();
    let err = launch1("hipemu_test_reverse", 1, 64, &args[..1]).unwrap_err();
    assert!(
        err.to_string()
            .contains("1 arguments given, the kernel takes 2"),
        "{err}"
    );
    let err = launch1(
        "hipemu_test_reverse",
        1,
        64,
        &[ptr(input.as_ptr()), arg(0u32)],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("argument 1 is 4 bytes, the kernel's parameter is 8"),
        "{err}"
    );
    let err = launch1("hipemu_test_reverse", 0, 64, &args).unwrap_err();
    assert!(matches!(err, ExecError::InvalidLaunch { .. }), "{err:?}");
    launch1("hipemu_test_no_params", 2, 1, &[]).unwrap();
}

#[test]
fn host_builds_hold_every_kernel_with_its_parameter_sizes() {
    if !available() {
        return;
    }
    let k = common::kernel("matmul_nn_f32");
    assert_eq!(
        k.param_sizes,
        &[8, 8, 8, 8, 4, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4]
    );
    assert_eq!(common::kernel("adamw_bf16").param_sizes.len(), 14);
    assert_eq!(common::kernel("hipemu_test_no_params").param_sizes.len(), 0);
    assert!(
        common::host_module("hip-emu/tests/kernels/checks.hip", true)
            .lookup("no_such_kernel")
            .is_none()
    );
    // hip-rt's test kernels (hip-rt/kernels/test_kernels.hip): hipk_test_add/scale(float*, float, int).
    for name in ["hipk_test_add", "hipk_test_scale"] {
        assert_eq!(common::kernel(name).param_sizes, &[8, 4, 4], "{name}");
    }
}

#[test]
fn the_race_check_reports_a_missing_barrier_at_both_source_lines() {
    if !available() {
        return;
    }
    let input: Vec<i32> = (0..128).collect();
    let mut out = vec![0i32; 128];
    let args = [ptr(input.as_ptr()), ptr(out.as_mut_ptr())];
    let err = launch1("hipemu_test_racy_reverse", 1, 128, &args).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ExecError::Race { .. }), "{err:?}");
    // Wave 0 runs first: thread 63 reads buf[64] (line 129) before thread 64 of wave 1 writes it
    // (line 128).
    assert!(
        msg.contains("thread (63, 0, 0) (read at hip-emu/tests/kernels/checks.hip:129)"),
        "{msg}"
    );
    assert!(
        msg.contains("thread (64, 0, 0) (write at hip-emu/tests/kernels/checks.hip:128)"),
        "{msg}"
    );
    // The same exchange with its barrier is clean.
    launch1("hipemu_test_reverse", 1, 128, &args).unwrap();
}

#[test]
fn a_wave_barrier_orders_lds_accesses_within_a_wave() {
    if !available() {
        return;
    }
    let mut out = vec![0i32; 64];
    launch1(
        "hipemu_test_wave_lds",
        1,
        64,
        &[ptr_mut(out.as_mut_ptr()), arg(1i32)],
    )
    .unwrap();
    assert!(
        out.iter().enumerate().all(|(t, &o)| o == (t ^ 1) as i32),
        "{out:?}"
    );
    let err = launch1(
        "hipemu_test_wave_lds",
        1,
        64,
        &[ptr_mut(out.as_mut_ptr()), arg(0i32)],
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::Race { .. }), "{err:?}");
}

#[test]
fn readlane_ds_swizzle_and_perm_follow_the_isa() {
    if !available() {
        return;
    }
    let n = 96usize; // a full wave and a partial one of 32 lanes
    let v: Vec<i32> = (0..n as i32)
        .map(|i| i.wrapping_mul(0x0101_0101) ^ 0x7f00_00f0)
        .collect();
    let mut out = vec![0u32; 4 * n];
    launch1(
        "hipemu_test_lane_ops",
        1,
        n as u32,
        &[ptr(v.as_ptr()), ptr_mut(out.as_mut_ptr())],
    )
    .unwrap();
    let get = |l: usize| if l < n { v[l] as u32 } else { 0 };
    for t in 0..n {
        let (lane, w0) = (t % 64, t - t % 64);
        assert_eq!(out[4 * t], get(w0 + 37), "readlane, thread {t}");
        assert_eq!(
            out[4 * t + 1],
            get(w0 + (lane ^ 4)),
            "swizzle xor 4, thread {t}"
        );
        assert_eq!(
            out[4 * t + 2],
            get(w0 + (lane & !3) + (3 - (lane & 3))),
            "swizzle quad, thread {t}"
        );
        // sel bytes (low to high) 0x0F, 0x04, 0x0D, 0x0C: 0xFF, byte 4 (0xBB), 0xFF, 0x00.
        assert_eq!(out[4 * t + 3], 0x00FF_BBFF, "perm, thread {t}");
    }
}

#[test]
fn cpp_kernels_get_the_bounds_and_race_checks_too() {
    if !available() {
        return;
    }
    let buf = Guarded::<f32>::new(1000, 1.0);
    let mut sum = 0f32;
    // cpp_read(const float*, long long, float*), under its mangled symbol.
    let read = "_Z8cpp_readPKfxPf";
    launch1(
        read,
        1,
        64,
        &[ptr(buf.data), arg(1000i64), ptr_mut(&mut sum)],
    )
    .unwrap();
    assert_eq!(sum, 1000.0);
    let err = launch1(
        read,
        1,
        64,
        &[ptr(buf.data), arg(1001i64), ptr_mut(&mut sum)],
    )
    .unwrap_err();
    assert!(matches!(err, ExecError::Fault { .. }), "{err:?}");
    let input: Vec<i32> = (0..128).collect();
    let mut out = vec![0i32; 128];
    let args = [ptr(input.as_ptr()), ptr(out.as_mut_ptr())];
    let err = launch1("_Z16cpp_racy_reverseILi1024EEvPKiPi", 1, 128, &args).unwrap_err();
    assert!(matches!(err, ExecError::Race { .. }), "{err:?}");
    assert!(err.to_string().contains("checks.hip:"), "{err}");
}
