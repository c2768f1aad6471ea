//! Pure parts of the communicator layer: the id's serialised forms, the count rules, op values.

use super::collectives::{block_count, check_rank, expect_len};
use super::*;

#[test]
fn unique_id_round_trips_through_hex_and_bytes() {
    let bytes: Vec<u8> = (0..128u32).map(|i| (i * 37 + 11) as u8).collect();
    let id = UniqueId::from_bytes(&bytes).unwrap();
    assert_eq!(id.to_bytes().to_vec(), bytes);
    let hex = id.to_hex();
    assert_eq!(hex.len(), 256);
    assert!(hex.starts_with("0b30"), "{hex}");
    assert_eq!(UniqueId::from_hex(&hex).unwrap(), id);
    assert_eq!(hex.parse::<UniqueId>().unwrap(), id);
    assert_eq!(
        UniqueId::from_hex(&format!("  {}\n", hex.to_uppercase())).unwrap(),
        id
    );
    assert_eq!(id.to_string(), hex);
    assert!(format!("{id:?}").starts_with("UniqueId(0b30"));
}

#[test]
fn malformed_ids_are_typed_errors() {
    let short = UniqueId::from_bytes(&[0; 127]).unwrap_err().to_string();
    assert!(
        short.contains("127 bytes") && short.contains("128"),
        "{short}"
    );
    let odd = UniqueId::from_hex("abc").unwrap_err().to_string();
    assert!(odd.contains("3 characters") && odd.contains("256"), "{odd}");
    let mut bad = "0".repeat(256);
    bad.replace_range(200..201, "g");
    let text = UniqueId::from_hex(&bad).unwrap_err().to_string();
    assert!(
        text.contains("'g'") && text.contains("position 200"),
        "{text}"
    );
}

#[test]
fn count_rules_name_the_buffer_and_the_rule() {
    assert!(expect_len("ncclAllReduce", "recv", 8, 8, String::new).is_ok());
    let text = expect_len("ncclReduceScatter", "send", 10, 12, || {
        "send = recv (3) × world (4)".into()
    })
    .unwrap_err()
    .to_string();
    for needle in [
        "ncclReduceScatter",
        "send holds 10",
        "must hold 12",
        "world (4)",
    ] {
        assert!(text.contains(needle), "{needle:?}: {text}");
    }
    assert_eq!(block_count("ncclAllGather", 12, 4).unwrap(), 3);
    assert_eq!(block_count("ncclAllGather", 0, 3).unwrap(), 0);
    let text = block_count("ncclAllGather", 10, 4).unwrap_err().to_string();
    assert!(text.contains("multiple of world (4)"), "{text}");
    assert_eq!(check_rank("ncclBroadcast", "root", 2, 3).unwrap(), 2);
    let text = check_rank("ncclBroadcast", "root", 3, 3)
        .unwrap_err()
        .to_string();
    assert!(text.contains("root 3") && text.contains("0..3"), "{text}");
}

#[test]
fn ops_and_types_map_to_rccl_values() {
    use hip_sys::rccl::{ncclDataType_t as D, ncclRedOp_t as R};
    let raw: Vec<R> = ReduceOp::ALL.iter().map(|op| op.raw()).collect();
    assert_eq!(
        raw,
        [R::ncclSum, R::ncclProd, R::ncclMax, R::ncclMin, R::ncclAvg]
    );
    assert_eq!(ReduceOp::Avg.name(), "avg");
    assert_eq!(<f32 as CommElement>::DTYPE, D::ncclFloat32);
    assert_eq!(<half::f16 as CommElement>::DTYPE, D::ncclFloat16);
    assert_eq!(<half::bf16 as CommElement>::DTYPE, D::ncclBfloat16);
    assert_eq!(<i32 as CommElement>::DTYPE, D::ncclInt32);
    assert_eq!(<u8 as CommElement>::DTYPE, D::ncclUint8);
}

#[test]
fn bus_bandwidth_factors_follow_nccl_tests() {
    use check::Collective as C;
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    assert!(close(C::AllReduce.bus_factor(4), 1.5));
    assert!(close(C::AllReduce.bus_factor(2), 1.0));
    assert!(close(C::ReduceScatter.bus_factor(4), 0.75));
    assert!(close(C::AllGather.bus_factor(3), 2.0 / 3.0));
    assert!(close(C::Broadcast.bus_factor(8), 1.0));
    assert!(close(C::Reduce.bus_factor(8), 1.0));
    assert!(close(C::AllReduce.bus_factor(1), 0.0));
    // Counts: the larger buffer, a multiple of world where blocks are per rank.
    assert_eq!(C::AllReduce.count(1000, 4, 3), 250);
    assert_eq!(C::AllGather.count(1000, 4, 3), 249);
    assert_eq!(C::ReduceScatter.count(8, 4, 4), 0);
    assert_eq!(C::parse("allreduce"), Some(C::AllReduce));
    assert_eq!(C::parse("Reduce-Scatter"), Some(C::ReduceScatter));
    assert_eq!(C::parse("all_gather"), Some(C::AllGather));
    assert_eq!(C::parse("gather"), None);
    assert!(!C::Broadcast.reduces() && C::Reduce.reduces());
}

#[test]
fn sizes_double_and_parse_with_suffixes() {
    let s = check::sizes(8, 256 << 20);
    assert_eq!(
        (s[0], s[1], *s.last().unwrap(), s.len()),
        (8, 16, 256 << 20, 26)
    );
    assert_eq!(check::sizes(8, 4), Vec::<usize>::new());
    assert_eq!(check::parse_size("8"), Some(8));
    assert_eq!(check::parse_size("64K"), Some(64 << 10));
    assert_eq!(check::parse_size("256MB"), Some(256 << 20));
    assert_eq!(check::parse_size("1g"), Some(1 << 30));
    assert_eq!(check::parse_size("x"), None);
    assert_eq!(check::parse_size(""), None);
}

#[test]
fn check_inputs_reduce_exactly_in_every_type() {
    use check::{input, matches, reduce, CheckElement};
    use half::{bf16, f16};
    fn exact<T: CheckElement>(world: usize) {
        for op in ReduceOp::ALL {
            for i in 0..12 {
                let vals: Vec<f64> = (0..world).map(|r| input(r, i, world, op)).collect();
                for &v in &vals {
                    assert_eq!(T::from_f64(v).to_f64(), v, "{} input {v}", T::NAME);
                }
                let want = reduce(vals.iter().copied(), op, world);
                assert_eq!(want.fract(), 0.0, "{op:?} world {world}: {want}");
                assert!(
                    matches(T::from_f64(want), want, op),
                    "{} {op:?} {want}",
                    T::NAME
                );
                assert!(!matches(T::from_f64(want + 1.0), want, op));
            }
        }
    }
    for world in 1..=8 {
        exact::<f32>(world);
        exact::<f16>(world);
        exact::<bf16>(world);
        exact::<i32>(world);
        exact::<u8>(world);
    }
    // Products are exactly 2 whatever the world size.
    assert_eq!(
        reduce(
            (0..8).map(|r| input(r, 5, 8, ReduceOp::Prod)),
            ReduceOp::Prod,
            8
        ),
        2.0
    );
}
