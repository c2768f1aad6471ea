//! RCCL's ABI as its header `nccl.h` (ROCm/rccl `src/nccl.h.in`) defines it, the version code,
//! the search list and loading failures. No RCCL is needed.

use super::abi::*;
use super::*;
use crate::search::{targets, Target};
use std::collections::HashMap;
use std::ffi::OsString;

#[test]
fn unique_id_is_128_bytes_passed_by_value() {
    // `typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;`, 128 bytes.
    assert_eq!(NCCL_UNIQUE_ID_BYTES, 128);
    assert_eq!(std::mem::size_of::<ncclUniqueId>(), 128);
    assert_eq!(std::mem::align_of::<ncclUniqueId>(), 1);
    let mut bytes = [0u8; 128];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7 + 200) as u8; // values above 127 survive the c_char round trip
    }
    let id = ncclUniqueId::from_bytes(bytes);
    assert_eq!(id.to_bytes(), bytes);
    assert!(format!("{id:?}").starts_with("ncclUniqueId(c8cf"), "{id:?}");
    assert_eq!(
        std::mem::size_of::<ncclComm_t>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn enums_are_four_bytes_with_the_header_values() {
    assert_eq!(std::mem::size_of::<ncclResult_t>(), 4);
    assert_eq!(std::mem::size_of::<ncclDataType_t>(), 4);
    assert_eq!(std::mem::size_of::<ncclRedOp_t>(), 4);
    let types = [
        (ncclDataType_t::ncclInt8, 0, 1),
        (ncclDataType_t::ncclUint8, 1, 1),
        (ncclDataType_t::ncclInt32, 2, 4),
        (ncclDataType_t::ncclUint32, 3, 4),
        (ncclDataType_t::ncclInt64, 4, 8),
        (ncclDataType_t::ncclUint64, 5, 8),
        (ncclDataType_t::ncclFloat16, 6, 2),
        (ncclDataType_t::ncclFloat32, 7, 4),
        (ncclDataType_t::ncclFloat64, 8, 8),
        (ncclDataType_t::ncclBfloat16, 9, 2),
    ];
    for (ty, value, size) in types {
        assert_eq!(
            (ty.0, ty.size_bytes()),
            (value, Some(size)),
            "{}",
            ty.name()
        );
    }
    assert_eq!(
        ncclDataType_t(10).size_bytes(),
        None,
        "fp8 types are not bound"
    );
    let ops = [
        (ncclRedOp_t::ncclSum, 0),
        (ncclRedOp_t::ncclProd, 1),
        (ncclRedOp_t::ncclMax, 2),
        (ncclRedOp_t::ncclMin, 3),
        (ncclRedOp_t::ncclAvg, 4),
    ];
    for (op, value) in ops {
        assert_eq!(op.0, value, "{}", op.name());
    }
    assert_eq!(ncclRedOp_t(4).name(), "ncclAvg");
    let results = [
        (ncclResult_t::ncclSuccess, 0),
        (ncclResult_t::ncclUnhandledCudaError, 1),
        (ncclResult_t::ncclSystemError, 2),
        (ncclResult_t::ncclInternalError, 3),
        (ncclResult_t::ncclInvalidArgument, 4),
        (ncclResult_t::ncclInvalidUsage, 5),
        (ncclResult_t::ncclRemoteError, 6),
        (ncclResult_t::ncclInProgress, 7),
    ];
    for (code, value) in results {
        assert_eq!(code.0, value, "{}", code.name());
    }
}

#[test]
fn status_results_name_the_code_and_hint() {
    assert!(ncclResult_t::ncclSuccess.result().is_ok());
    let err = ncclResult_t(5).result().unwrap_err();
    assert!(matches!(err, Error::Rccl(RcclError { code }) if code.0 == 5));
    let text = err.to_string();
    assert!(
        text.starts_with("RCCL error 5 ncclInvalidUsage. Hint: "),
        "{text}"
    );
    assert_eq!(ncclResult_t(42).name(), "unrecognized");
}

#[test]
fn version_codes_decode_both_encodings() {
    let cases = [
        // X*1000 + Y*100 + Z up to 2.8 ...
        (2708, (2, 7, 8)),
        (2804, (2, 8, 4)),
        // ... X*10000 + Y*100 + Z from 2.9 on (ROCm 5.x/6.x ship 2.1x-2.2x).
        (20907, (2, 9, 7)),
        (21003, (2, 10, 3)),
        (21813, (2, 18, 13)),
        (22203, (2, 22, 3)),
    ];
    for (code, (major, minor, patch)) in cases {
        let v = RcclVersion::decode(code).unwrap();
        assert_eq!(
            (v.major, v.minor, v.patch, v.code),
            (major, minor, patch, code)
        );
    }
    assert_eq!(RcclVersion::decode(21813).unwrap().to_string(), "2.18.13");
    assert_eq!(RcclVersion::decode(0), None);
    assert_eq!(RcclVersion::decode(-1), None);
}

#[test]
fn avg_needs_nccl_2_10() {
    let old = RcclVersion::decode(2804).unwrap();
    let first = RcclVersion::decode(21003).unwrap();
    let nine = RcclVersion::decode(20907).unwrap();
    assert!(!old.supports_op(ncclRedOp_t::ncclAvg));
    assert!(!nine.supports_op(ncclRedOp_t::ncclAvg));
    assert!(first.supports_op(ncclRedOp_t::ncclAvg));
    for op in [ncclRedOp_t::ncclSum, ncclRedOp_t::ncclMax] {
        assert!(old.supports_op(op));
    }
    let err = Error::RcclUnsupported {
        what: ncclRedOp_t::ncclAvg.name(),
        version: old,
        needs: "a release based on NCCL 2.10 or later",
    };
    let text = err.to_string();
    assert!(
        text.contains("ncclAvg") && text.contains("2.8.4") && text.contains("2.10"),
        "{text}"
    );
}

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn dirs(t: &[Target]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for target in t {
        if let Target::File(p) = target {
            let d = p.parent().unwrap().display().to_string();
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    out
}

#[test]
fn search_list_covers_dtk_and_rocm_layouts() {
    let t = targets(&RCCL, &env_of(&[]));
    assert_eq!(
        dirs(&t),
        [
            "/opt/dtk/lib",
            "/opt/dtk/rccl/lib",
            "/opt/rocm/lib",
            "/opt/rocm/rccl/lib"
        ]
    );
    assert_eq!(t[0], Target::File("/opt/dtk/lib/librccl.so".into()));
    assert_eq!(t[1], Target::File("/opt/dtk/lib/librccl.so.1".into()));
    assert_eq!(t.len(), 4 * 3 + 3);
    assert_eq!(t[12], Target::SystemLoader("librccl.so"));
    let t = targets(&RCCL, &env_of(&[("ROCM_PATH", "/opt/rocm-6.3.0")]));
    assert_eq!(
        dirs(&t)[..2],
        ["/opt/rocm-6.3.0/lib", "/opt/rocm-6.3.0/rccl/lib"]
    );
    // DTK's env.sh sets ROCM_PATH=/opt/dtk: its directories are tried once.
    let t = targets(&RCCL, &env_of(&[("ROCM_PATH", "/opt/dtk")]));
    assert_eq!(dirs(&t).len(), 4);
    let t = targets(
        &RCCL,
        &env_of(&[
            ("HIPK_RCCL_LIBRARY", "/x/librccl.so.1"),
            ("ROCM_PATH", "/r"),
        ]),
    );
    assert_eq!(t, [Target::File("/x/librccl.so.1".into())]);
    assert_eq!(
        crate::search::steering_vars(&RCCL),
        ["HIPK_RCCL_LIBRARY", "ROCM_PATH", "LD_LIBRARY_PATH"]
    );
}

#[test]
fn loading_a_missing_file_or_a_non_rccl_library_is_typed() {
    let err = load_rccl_from(Path::new("/nonexistent/librccl.so")).unwrap_err();
    let Error::NotFound { report } = &err else {
        panic!("{err:?}")
    };
    assert!(
        report.to_string().contains("/nonexistent/librccl.so"),
        "{report}"
    );
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    if libc.is_file() {
        let err = load_rccl_from(libc).unwrap_err();
        assert!(matches!(&err, Error::NotRccl { missing, .. } if missing == &["ncclGetVersion"]));
        let text = err.to_string();
        assert!(
            text.contains("not RCCL") && text.contains("HIPK_RCCL_LIBRARY"),
            "{text}"
        );
    }
}
