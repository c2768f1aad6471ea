//! Runs the CPU reference on every golden case in `tests/golden/` and in each directory listed in
//! `HIPK_GOLDEN_DIR` (colon-separated). A case that cannot be read, names an unknown op, or
//! mismatches is a failure; all failures are listed before the test fails.

use hip_kernels::golden::{
    self, case_files, committed_dir, env_dirs, load_case, run_case_with, CpuBackend, GoldenError,
    TensorData,
};
use std::io::Write;
use std::path::{Path, PathBuf};

fn all_case_files() -> Vec<PathBuf> {
    let mut dirs = vec![committed_dir()];
    dirs.extend(env_dirs());
    let mut files = Vec::new();
    for dir in &dirs {
        match case_files(dir) {
            Ok(f) if f.is_empty() => panic!("golden: no *.safetensors cases in {}", dir.display()),
            Ok(f) => files.extend(f),
            Err(e) => panic!("{e}"),
        }
    }
    files
}

/// `golden::run_case`, with a panic turned into an error naming the case file.
fn run_case_guarded(p: &Path) -> Result<golden::CaseReport, GoldenError> {
    std::panic::catch_unwind(|| golden::run_case(p)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(GoldenError::Panicked {
            path: p.to_path_buf(),
            message,
        })
    })
}

#[test]
fn golden_cases_pass_on_the_cpu_reference() {
    let files = all_case_files();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(files.len().div_ceil(4).max(1))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|p| (p.clone(), run_case_guarded(p)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect::<Vec<_>>()
    });
    assert_eq!(results.len(), files.len(), "a worker thread panicked");
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(p, r)| r.as_ref().err().map(|e| format!("{}: {e}", p.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} golden cases failed:\n{}",
        failures.len(),
        results.len(),
        failures.join("\n")
    );
    // Written to the stderr handle directly so it shows without --nocapture (the print macros
    // are captured by the test harness).
    let _ = writeln!(std::io::stderr(), "golden: {} cases passed", results.len());
}

#[test]
fn committed_cases_cover_every_op_and_dtype() {
    let mut seen = std::collections::HashSet::new();
    for p in case_files(&committed_dir()).unwrap() {
        let c = load_case(&p).unwrap();
        seen.insert((c.op(), c.dtype));
    }
    for op in hip_kernels::ops::golden_op_names() {
        // `clip` works on f32 scalars (a norm, a loss scale) whatever the model's dtype.
        let dtypes: &[hip_kernels::params::DType] = if op == "clip" {
            &[hip_kernels::params::DType::F32]
        } else {
            &hip_kernels::params::DType::ALL
        };
        for &dt in dtypes {
            assert!(
                seen.contains(&(op, dt)),
                "no committed golden case for {op} {dt}"
            );
        }
    }
}

/// Perturb one expected element by a few tolerances; the comparison must report exactly it.
fn perturbed_fails(name: &str, tensor: &str, index: usize) {
    let mut case = load_case(&committed_dir().join(format!("{name}.safetensors"))).unwrap();
    run_case_with(&mut CpuBackend, &case).unwrap();
    let (_, t) = case.expected.iter_mut().find(|(n, _)| n == tensor).unwrap();
    let bump = |x: f64| x + 0.05 * x.abs() + 0.01;
    match &mut t.data {
        TensorData::F32(v) => v[index] = bump(f64::from(v[index])) as f32,
        TensorData::F16(v) => v[index] = half::f16::from_f64(bump(v[index].to_f64())),
        TensorData::BF16(v) => v[index] = half::bf16::from_f64(bump(v[index].to_f64())),
    }
    match run_case_with(&mut CpuBackend, &case) {
        Err(GoldenError::Mismatch(m)) => {
            assert_eq!(
                (m.case.as_str(), m.tensor.as_str(), m.index, m.bad),
                (name, tensor, index, 1)
            );
            let text = m.to_string();
            assert!(
                text.contains(name) && text.contains(tensor) && text.contains("expected"),
                "{text}"
            );
        }
        other => panic!("perturbed {name}/{tensor}[{index}] not reported: {other:?}"),
    }
}

#[test]
fn a_wrong_expected_value_is_reported() {
    perturbed_fails("matmul_f32_odd_ta", "out", 17);
    perturbed_fails("matmul_bf16_batch_beta", "out", 40);
    perturbed_fails("layernorm_forward_f16_odd", "rstd", 3);
    perturbed_fails("layernorm_backward_bf16_wide", "dweight", 700);
    perturbed_fails("attention_forward_f32_d80_causal", "lse", 5);
    perturbed_fails("attention_backward_f16_d32_tq_lt_tk_causal", "dk", 100);
    perturbed_fails("adamw_f32_amsgrad", "exp_avg_sq", 9);
    perturbed_fails("adamw_bf16_all_flags", "param", 50);
    perturbed_fails("encoder_backward_f32_repeats", "dwte", 70);
    perturbed_fails("crossentropy_f32_gpt2_row", "dlogits", 50_000);
    perturbed_fails("crossentropy_bf16_huge", "losses", 0);
    perturbed_fails("attention_backward_strided_f16_bt3hd_causal", "dqkv", 500);
    perturbed_fails("gelu_backward_bf16_odd", "dx", 1000);
    perturbed_fails("bias_backward_f32_acc", "dbias", 129);
    perturbed_fails("residual_layernorm_forward_f16_odd", "residual", 11);
    perturbed_fails("clip_f32_loss_scale", "grad_scale", 0);
}

#[test]
fn unreadable_or_unknown_cases_are_errors() {
    let dir = std::env::temp_dir().join(format!("hipk-golden-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.safetensors");
    std::fs::write(&garbage, b"not a safetensors file").unwrap();
    assert!(matches!(
        golden::run_case(&garbage),
        Err(GoldenError::Format { .. })
    ));
    // A valid file with an unknown op.
    let mut bytes = std::fs::read(committed_dir().join("adamw_f32_plain.safetensors")).unwrap();
    let key = b"\"op\":\"adamw\"";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("fixture header has a compact op key");
    bytes[at + key.len() - 2] = b'x';
    let unknown = dir.join("unknown.safetensors");
    std::fs::write(&unknown, &bytes).unwrap();
    let err = golden::run_case(&unknown).unwrap_err();
    assert!(
        matches!(&err, GoldenError::UnknownOp { op, .. } if op == "adamx"),
        "{err}"
    );
    assert!(
        err.to_string().contains("unknown.") || err.to_string().contains("unknown op"),
        "{err}"
    );
    let missing = golden::run_case(&dir.join("missing.safetensors")).unwrap_err();
    assert!(matches!(missing, GoldenError::Io { .. }));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rewrite a committed case: `edit` may change the metadata and the tensor list.
fn rewritten(
    case: &str,
    edit: impl FnOnce(
        &mut std::collections::HashMap<String, String>,
        &mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>,
    ),
) -> Result<golden::Case, GoldenError> {
    let bytes = std::fs::read(committed_dir().join(format!("{case}.safetensors"))).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut meta, &mut tensors);
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let out = safetensors::serialize(views, &Some(meta)).unwrap();
    golden::parse_case(case, &out)
}

#[test]
fn malformed_cases_name_the_case_and_key() {
    let err = |r: Result<golden::Case, GoldenError>| r.unwrap_err().to_string();
    assert!(rewritten("matmul_f32_k1", |_, _| {}).is_ok());
    let e = err(rewritten("matmul_f32_k1", |m, _| {
        m.insert("trans_a".into(), "True".into());
    }));
    assert!(
        e.contains("matmul_f32_k1") && e.contains("`trans_a`") && e.contains("\"True\""),
        "{e}"
    );
    let e = err(rewritten("matmul_f32_k1", |m, _| {
        m.remove("alpha");
    }));
    assert!(e.contains("`alpha` is missing"), "{e}");
    let e = err(rewritten("layernorm_forward_f32_odd", |m, _| {
        m.insert("eps".into(), "1e-5x".into());
    }));
    assert!(e.contains("`eps`") && e.contains("1e-5x"), "{e}");
    let e = err(rewritten("matmul_f32_k1", |_, t| {
        let b = t.iter_mut().find(|x| x.0 == "b").unwrap();
        b.2 = vec![b.2[1], b.2[0]];
    }));
    assert!(
        e.contains("tensor `b` has shape [4, 1] but must be [1, 1]"),
        "{e}"
    );
    let e = err(rewritten("matmul_f32_k1", |_, t| {
        t.push(("c".into(), safetensors::Dtype::F32, vec![3, 4], vec![0; 48]));
    }));
    assert!(e.contains("unexpected tensor `c`"), "{e}");
    let e = err(rewritten("matmul_f32_batch_beta", |_, t| {
        t.retain(|x| x.0 != "c")
    }));
    assert!(e.contains("tensor `c` is missing"), "{e}");
    let e = err(rewritten("adamw_f32_plain", |_, t| {
        t.retain(|x| x.0 != "expected_exp_avg")
    }));
    assert!(e.contains("`expected_exp_avg` is missing"), "{e}");
    let e = err(rewritten("adamw_f32_plain", |_, t| {
        t.push(("note".into(), safetensors::Dtype::F32, vec![1], vec![0; 4]));
    }));
    assert!(e.contains("unexpected tensor `note`"), "{e}");
    let e = err(rewritten("attention_forward_f16_d16_causal", |_, t| {
        let lse = t.iter_mut().find(|x| x.0 == "expected_lse").unwrap();
        lse.1 = safetensors::Dtype::F16;
        lse.3.truncate(lse.3.len() / 2);
    }));
    assert!(
        e.contains("`expected_lse` has dtype f16 but must be f32"),
        "{e}"
    );
    let e = err(rewritten("attention_forward_f32_d16_causal", |_, t| {
        let q = t.iter_mut().find(|x| x.0 == "q").unwrap();
        q.1 = safetensors::Dtype::F64;
        q.2[3] /= 2;
    }));
    assert!(
        e.contains("`q` has dtype F64 but must be F32, F16 or BF16"),
        "{e}"
    );
}
