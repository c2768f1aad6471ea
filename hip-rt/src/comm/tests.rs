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
