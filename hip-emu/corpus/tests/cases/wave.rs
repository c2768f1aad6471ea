//! Bit operations, every atomic, wave votes, shuffles with a width and cooperative-group tiles.

use super::{cfg1 as cfg, start};

fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let bytes = (u64::from(y) << 32) | u64::from(x);
    (0..4).fold(0, |r, i| {
        let sel = (s >> (4 * i)) & 7;
        r | ((((bytes >> (8 * sel)) & 0xFF) as u32) << (8 * i))
    })
}

#[test]
fn bit_operations() {
    let Some(e) = start() else { return };
    let input: Vec<u32> = (0..96u32)
        .map(|i| {
            if i == 0 {
                0
            } else {
                i.wrapping_mul(0x9E37_79B9) ^ (i << 7)
            }
        })
        .collect();
    let f = e.kernel("bit_ops", "bit_ops");
    let din = e.upload(&input);
    let mut dout = e.upload(&vec![0u32; 10 * input.len()]);
    // SAFETY: (const unsigned* in, unsigned* out, int n), 10 words per element.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut dout)
            .value(input.len() as i32)
            .launch(&cfg(2, 64, 0))
    }
    .unwrap();
    let want: Vec<u32> = input
        .iter()
        .flat_map(|&x| {
            let v = 0x0123_4567_89AB_CDEFu64.wrapping_mul(u64::from(x));
            [
                (x >> 4) & 0xFF,
                (x & !(0xFF << 12)) | (0xAB << 12),
                x.count_ones(),
                x.leading_zeros(),
                if x == 0 { 0 } else { x.trailing_zeros() + 1 },
                x.reverse_bits(),
                byte_perm(x, 0x1122_3344, 0x5140),
                ((v >> 20) & 0xFF_FFFF) as u32,
                (0xFFu64 * u64::from(x)).count_ones(),
                ((u64::from(x) * 0x9E37_79B9) >> 32) as u32,
            ]
        })
        .collect();
    assert_eq!(e.download(&dout), want);
}

#[test]
fn every_atomic() {
    let Some(e) = start() else { return };
    let f = e.kernel("atomics", "atomics");
    let mut dc = e.upload(&[0, 0, u32::MAX, u32::MAX, 0, 0, 0, 0, 0]);
    let mut df = e.upload(&[0f32]);
    let mut dd = e.upload(&[0f64]);
    let mut dd2 = e.upload(&[0f64]);
    // SAFETY: (unsigned* counters, float* f, double* d, double* d2), 256 threads.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg_mut(&mut dc)
            .arg_mut(&mut df)
            .arg_mut(&mut dd)
            .arg_mut(&mut dd2)
            .launch(&cfg(4, 64, 0))
    }
    .unwrap();
    let threads = 0..256u32;
    let want = [
        threads.clone().sum::<u32>(),
        threads.clone().map(|i| i * 7 % 1000).max().unwrap(),
        5,
        1,
        u32::MAX,
        threads.clone().fold(0, |a, i| a ^ i),
        256 % 100,
        999 - 255,
        42,
    ];
    assert_eq!(e.download(&dc), want, "add max min and or xor inc dec exch");
    assert_eq!(e.download(&df), [128.0]);
    assert_eq!(e.download(&dd), [64.0]);
    let harmonic: f64 = threads.map(|i| 1.0 / f64::from(i + 1)).sum();
    assert!((e.download(&dd2)[0] - harmonic).abs() < 1e-12);
}

#[test]
fn wave_votes_over_64_lanes() {
    let Some(e) = start() else { return };
    let input: Vec<i32> = (0..128)
        .map(|t| if t < 64 { t % 3 - 1 } else { t })
        .collect();
    let f = e.kernel("warp_vote", "warp_vote");
    let din = e.upload(&input);
    let mut db = e.upload(&[0u64; 2]);
    let mut dflags = e.upload(&[0i32; 6]);
    // SAFETY: (const int* in, unsigned long long* ballots, int* flags), 2 waves.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut db)
            .arg_mut(&mut dflags)
            .launch(&cfg(1, 128, 0))
    }
    .unwrap();
    let ballot = |w: usize| (0..64).fold(0u64, |m, l| m | (u64::from(input[64 * w + l] > 0) << l));
    assert_eq!(e.download(&db), [ballot(0), ballot(1)]);
    assert_eq!(
        e.download(&dflags),
        [0, 0, 64, 1, 1, 64],
        "any all active, per wave"
    );
}

#[test]
fn shuffles_with_a_width() {
    let Some(e) = start() else { return };
    let input: Vec<i32> = (0..64).map(|i| i * i % 17).collect();
    let f = e.kernel("shfl_width", "shfl_width");
    let din = e.upload(&input);
    let mut d16 = e.upload(&[0i32; 64]);
    let mut d8 = e.upload(&[0i32; 64]);
    let mut d32 = e.upload(&[0i32; 64]);
    // SAFETY: (const int* in, int* sum16, int* scan8, int* bcast32), one wave.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut d16)
            .arg_mut(&mut d8)
            .arg_mut(&mut d32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let sum16: Vec<i32> = (0..64)
        .map(|t| input[t / 16 * 16..][..16].iter().sum())
        .collect();
    let scan8: Vec<i32> = (0..64).map(|t| input[t / 8 * 8..=t].iter().sum()).collect();
    let bcast: Vec<i32> = (0..64).map(|t| input[t / 32 * 32 + 3]).collect();
    assert_eq!(e.download(&d16), sum16);
    assert_eq!(e.download(&d8), scan8);
    assert_eq!(e.download(&d32), bcast);
}

#[test]
fn cooperative_group_tiles() {
    let Some(e) = start() else { return };
    let input: Vec<i32> = (0..64).map(|i| 3 * i - 50).collect();
    let f = e.kernel("coop_groups", "tile_sums");
    let din = e.upload(&input);
    let mut d16 = e.upload(&[0i32; 4]);
    let mut d8 = e.upload(&[0i32; 64]);
    let mut dr = e.upload(&[0i32; 64]);
    // SAFETY: (const int* in, int* sum16, int* sum8, int* ranks), one block of 64.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut d16)
            .arg_mut(&mut d8)
            .arg_mut(&mut dr)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let sum16: Vec<i32> = input.chunks(16).map(|c| c.iter().sum()).collect();
    let sum8: Vec<i32> = (0..64)
        .map(|t| input[t / 8 * 8..][..8].iter().sum())
        .collect();
    let ranks: Vec<i32> = (0..64).map(|t| t % 8 + 100 * (t / 16)).collect();
    assert_eq!(e.download(&d16), sum16);
    assert_eq!(e.download(&d8), sum8);
    assert_eq!(e.download(&dr), ranks);
}
