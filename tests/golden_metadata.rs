//! Golden metadata is read strictly: repeated keys, keys the op does not read, and float values
//! that f32 rounding would change in kind (non-zero to zero, finite to infinite) are named errors
//! (issue 12, found by the probe).

use hip_kernels::golden::{committed_dir, parse_case, GoldenError};

/// A committed case with its JSON header rewritten by `edit` (tensor data unchanged).
fn edited(case: &str, edit: impl Fn(&str) -> String) -> Vec<u8> {
    let path = committed_dir().join(format!("{case}.safetensors"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).expect("UTF-8 header");
    let header = edit(header);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// `header` with metadata `key`'s value replaced by `value`.
fn set_meta(header: &str, key: &str, value: &str) -> String {
    let open = format!("\"{key}\":\"");
    let start = header
        .find(&open)
        .unwrap_or_else(|| panic!("no {key} in {header}"))
        + open.len();
    let end = start + header[start..].find('"').unwrap();
    format!("{}{value}{}", &header[..start], &header[end..])
}

/// `header` with `entry` (e.g. `"k":"v"`) added first in the metadata object.
fn add_meta(header: &str, entry: &str) -> String {
    header.replacen(
        "\"__metadata__\":{",
        &format!("\"__metadata__\":{{{entry},"),
        1,
    )
}

const LN: &str = "layernorm_forward_f32_odd";
const MM: &str = "matmul_f32_batch_beta";

#[test]
fn the_unedited_cases_parse() {
    for case in [LN, MM] {
        parse_case(case, &edited(case, str::to_string)).unwrap();
    }
}

#[test]
fn a_repeated_metadata_key_is_rejected() {
    let e = parse_case(LN, &edited(LN, |h| add_meta(h, "\"eps\":\"0.5\""))).unwrap_err();
    assert!(
        matches!(&e, GoldenError::DuplicateKey { case, key, place: "__metadata__" } if case == LN && key == "eps"),
        "{e}"
    );
    assert!(
        e.to_string().contains("`eps` appears more than once"),
        "{e}"
    );
}

#[test]
fn a_repeated_tensor_name_is_rejected() {
    let bytes = edited(LN, |h| {
        let at = h.find("\"bias\":{").expect("bias entry");
        let end = at + h[at..].find('}').unwrap() + 1;
        format!("{},{}{}", &h[..end], &h[at..end], &h[end..])
    });
    let e = parse_case(LN, &bytes).unwrap_err();
    assert!(
        matches!(&e, GoldenError::DuplicateKey { key, place: "header", .. } if key == "bias"),
        "{e}"
    );
}

#[test]
fn a_metadata_key_the_op_does_not_read_is_rejected() {
    let e = parse_case(LN, &edited(LN, |h| add_meta(h, "\"epsilon\":\"0.1\""))).unwrap_err();
    assert!(
        matches!(&e, GoldenError::UnknownMetadata { case, key, op } if case == LN && key == "epsilon" && op == "layernorm_forward"),
        "{e}"
    );
}

#[test]
fn a_float_that_f32_would_round_to_zero_is_rejected_not_zeroed() {
    // beta = 1e-50 is not 0: torch reads C. Rounded to f32 first it became 0 and the case's `c`
    // was called unexpected.
    let e = parse_case(MM, &edited(MM, |h| set_meta(h, "beta", "1e-50"))).unwrap_err();
    assert!(
        matches!(&e, GoldenError::BadMetadata { key, value, .. } if key == "beta" && value == "1e-50"),
        "{e}"
    );
    // eps = -1e-50 is negative; as f32 it was -0.0 and passed `eps >= 0`.
    let e = parse_case(LN, &edited(LN, |h| set_meta(h, "eps", "-1e-50"))).unwrap_err();
    assert!(
        matches!(&e, GoldenError::BadMetadata { key, value, .. } if key == "eps" && value == "-1e-50"),
        "{e}"
    );
    // alpha = 1e300 is finite; as f32 it was infinity.
    let e = parse_case(MM, &edited(MM, |h| set_meta(h, "alpha", "1e300"))).unwrap_err();
    assert!(
        matches!(&e, GoldenError::BadMetadata { key, value, .. } if key == "alpha" && value == "1e300"),
        "{e}"
    );
    // A value f32 rounds but keeps non-zero and finite is fine (eps = 1e-5 in every case).
    parse_case(LN, &edited(LN, |h| set_meta(h, "eps", "1e-40"))).unwrap();
}
