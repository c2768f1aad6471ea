use super::hipblas::soname_major;
use super::*;
use std::path::Path;

#[test]
fn gemm_ex_abi_detection() {
    let cases = [
        // (has _v2, has unsuffixed, soname major) -> ABI
        ((true, true, Some(2)), Some(GemmExAbi::V2Suffixed)),
        ((true, false, None), Some(GemmExAbi::V2Suffixed)),
        ((false, true, Some(0)), Some(GemmExAbi::Legacy)),
        ((false, true, Some(1)), Some(GemmExAbi::Legacy)),
        ((false, true, None), Some(GemmExAbi::Legacy)),
        ((false, true, Some(3)), Some(GemmExAbi::V2Unsuffixed)),
        ((false, false, Some(3)), None),
    ];
    for ((v2, plain, major), want) in cases {
        assert_eq!(
            GemmExAbi::detect(v2, plain, major),
            want,
            "{v2} {plain} {major:?}"
        );
    }
    assert!(GemmExAbi::V2Unsuffixed.is_v2() && !GemmExAbi::Legacy.is_v2());
}

#[test]
fn soname_major_from_file_names() {
    let cases = [
        ("/opt/rocm/lib/libhipblas.so.2.0.60300", Some(2)),
        ("/opt/rocm/lib/libhipblas.so.3", Some(3)),
        ("/opt/dtk/lib/libhipblas.so.0.1", Some(0)),
        ("/opt/rocm/lib/libhipblas.so", None),
        ("libhipblas.so.x", None),
    ];
    for (path, want) in cases {
        assert_eq!(soname_major(Path::new(path)), want, "{path}");
    }
}

#[test]
fn status_names_and_results() {
    assert!(hipblasStatus_t::HIPBLAS_STATUS_SUCCESS.result().is_ok());
    assert_eq!(hipblasStatus_t(7).name(), "HIPBLAS_STATUS_NOT_SUPPORTED");
    assert_eq!(hipblasStatus_t(11).name(), "HIPBLAS_STATUS_UNKNOWN");
    assert_eq!(hipblasStatus_t(99).name(), "unrecognized");
    let text = hipblasStatus_t(3).result().unwrap_err().to_string();
    assert_eq!(text, "hipBLAS error 3 HIPBLAS_STATUS_INVALID_VALUE");
    assert!(rocblas_status::rocblas_status_success.result().is_ok());
    assert_eq!(rocblas_status(15).name(), "rocblas_status_arch_mismatch");
    let text = rocblas_status(6).result().unwrap_err().to_string();
    assert_eq!(text, "rocBLAS error 6 rocblas_status_internal_error");
    let text = rocblas_status(15).result().unwrap_err().to_string();
    assert!(
        text.starts_with("rocBLAS error 15 rocblas_status_arch_mismatch. Hint: "),
        "{text}"
    );
    let text = hipblasStatus_t(8).result().unwrap_err().to_string();
    assert!(text.contains("arch"), "{text}");
}

#[test]
fn enum_values_follow_the_headers() {
    assert_eq!(hipblasOperation_t::HIPBLAS_OP_N.0, 111);
    assert_eq!(hipblasOperation_t::HIPBLAS_OP_T.0, 112);
    assert_eq!(hipblasDatatype_t::HIPBLAS_R_16F.0, 150);
    assert_eq!(hipblasDatatype_t::HIPBLAS_R_32F.0, 151);
    assert_eq!(hipblasDatatype_t::HIPBLAS_R_16B.0, 168);
    assert_eq!(hipDataType::HIP_R_32F.0, 0);
    assert_eq!(hipDataType::HIP_R_16F.0, 2);
    assert_eq!(hipDataType::HIP_R_16BF.0, 14);
    assert_eq!(hipblasComputeType_t::HIPBLAS_COMPUTE_32F.0, 2);
    assert_eq!(hipblasGemmAlgo_t::HIPBLAS_GEMM_DEFAULT.0, 160);
    assert_eq!(rocblas_operation::rocblas_operation_transpose.0, 112);
    assert_eq!(rocblas_datatype::rocblas_datatype_f16_r.0, 150);
    assert_eq!(rocblas_datatype::rocblas_datatype_bf16_r.0, 168);
}

/// hipDataType's numbers against the installed `library_types.h`, when present (5.2 defines
/// only the float types; the others are from ROCm 6's header).
#[test]
fn hip_data_type_matches_installed_header() {
    let header = Path::new("/usr/include/hip/library_types.h");
    let Ok(text) = std::fs::read_to_string(header) else {
        eprintln!("skipped: {} not installed", header.display());
        return;
    };
    for (name, value) in [
        ("HIP_R_32F", hipDataType::HIP_R_32F.0),
        ("HIP_R_64F", hipDataType::HIP_R_64F.0),
        ("HIP_R_16F", hipDataType::HIP_R_16F.0),
    ] {
        let want = format!("{name} = {value},");
        assert!(text.contains(&want), "{want:?} not in {}", header.display());
    }
}
