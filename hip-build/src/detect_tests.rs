//! Table tests of `detect.rs` (the rules a kernel build applies), with no hipcc needed.

use crate::detect::*;
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// A fake environment for `find_hipcc`.
fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |k: &str| map.get(k).cloned()
}

fn exists_in(files: &'static [&'static str]) -> impl Fn(&Path) -> bool {
    move |p: &Path| files.iter().any(|f| Path::new(f) == p)
}

#[test]
fn hipcc_search_order_is_the_documented_one() {
    let env = env_of(&[
        ("HIPK_HIPCC", "/a/hipcc"),
        ("HIPCC", "/b/hipcc"),
        ("ROCM_PATH", "/rocm"),
        ("HIP_PATH", "/hip"),
        ("PATH", "/usr/local/bin:/usr/bin"),
    ]);
    let order: Vec<(PathBuf, HipccOrigin)> = hipcc_candidates(&env);
    let expected = [
        ("/a/hipcc", HipccOrigin::HipkHipcc),
        ("/b/hipcc", HipccOrigin::Hipcc),
        ("/rocm/bin/hipcc", HipccOrigin::RocmPath),
        ("/hip/bin/hipcc", HipccOrigin::HipPath),
        ("/opt/dtk/bin/hipcc", HipccOrigin::OptDtk),
        ("/opt/rocm/bin/hipcc", HipccOrigin::OptRocm),
        ("/usr/local/bin/hipcc", HipccOrigin::Path),
        ("/usr/bin/hipcc", HipccOrigin::Path),
    ];
    let expected: Vec<(PathBuf, HipccOrigin)> = expected
        .iter()
        .map(|(p, o)| (PathBuf::from(p), *o))
        .collect();
    assert_eq!(order, expected);
}

/// (environment, existing files, expected pick).
type FindCase = (
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
    Option<(&'static str, HipccOrigin)>,
);

#[test]
fn find_hipcc_picks_the_first_existing_candidate() {
    let cases: &[FindCase] = &[
        // Nothing set, DTK installed and a Debian hipcc on PATH: DTK wins.
        (
            &[("PATH", "/usr/bin")],
            &["/opt/dtk/bin/hipcc", "/usr/bin/hipcc"],
            Some(("/opt/dtk/bin/hipcc", HipccOrigin::OptDtk)),
        ),
        // Only PATH.
        (
            &[("PATH", "/x:/usr/bin")],
            &["/usr/bin/hipcc"],
            Some(("/usr/bin/hipcc", HipccOrigin::Path)),
        ),
        // ROCM_PATH beats /opt.
        (
            &[("ROCM_PATH", "/r")],
            &["/r/bin/hipcc", "/opt/rocm/bin/hipcc"],
            Some(("/r/bin/hipcc", HipccOrigin::RocmPath)),
        ),
        // A ROCM_PATH without hipcc falls through to HIP_PATH.
        (
            &[("ROCM_PATH", "/r"), ("HIP_PATH", "/h")],
            &["/h/bin/hipcc"],
            Some(("/h/bin/hipcc", HipccOrigin::HipPath)),
        ),
        // HIPCC as a bare name is looked up on PATH.
        (
            &[("HIPCC", "hipcc-5.2"), ("PATH", "/a:/b")],
            &["/b/hipcc-5.2", "/opt/dtk/bin/hipcc"],
            Some(("/b/hipcc-5.2", HipccOrigin::Hipcc)),
        ),
        // Empty variables count as unset.
        (
            &[("HIPK_HIPCC", ""), ("PATH", "/usr/bin")],
            &["/usr/bin/hipcc"],
            Some(("/usr/bin/hipcc", HipccOrigin::Path)),
        ),
        // Nothing anywhere.
        (&[("PATH", "/usr/bin")], &[], None),
    ];
    for (env, files, want) in cases {
        let got = find_hipcc(&env_of(env), &exists_in(files));
        match want {
            Some((path, origin)) => assert_eq!(got, Ok((PathBuf::from(path), *origin)), "{env:?}"),
            None => assert_eq!(got, Err(HipccError::NotFound), "{env:?}"),
        }
    }
}

#[test]
fn an_explicit_hipcc_that_is_missing_is_an_error_not_a_fallthrough() {
    let env = env_of(&[("HIPK_HIPCC", "/nope/hipcc"), ("PATH", "/usr/bin")]);
    let err = find_hipcc(&env, &exists_in(&["/usr/bin/hipcc"])).unwrap_err();
    assert_eq!(
        err,
        HipccError::ExplicitMissing {
            var: "HIPK_HIPCC",
            value: "/nope/hipcc".into()
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("HIPK_HIPCC") && text.contains("/nope/hipcc"),
        "{text}"
    );
    let env = env_of(&[("HIPCC", "/nope/hipcc")]);
    let err = find_hipcc(&env, &exists_in(&["/opt/rocm/bin/hipcc"])).unwrap_err();
    assert!(matches!(
        err,
        HipccError::ExplicitMissing { var: "HIPCC", .. }
    ));
    assert!(HipccOrigin::HipkHipcc.is_explicit() && !HipccOrigin::Path.is_explicit());
}

#[test]
fn not_found_says_how_to_get_hipcc() {
    let text = HipccError::NotFound.to_string();
    assert!(
        text.contains("DTK") && text.contains("apt-get install hipcc"),
        "{text}"
    );
    assert!(text.contains("HIPK_HIPCC"), "{text}");
}

#[test]
fn arch_lists_parse_and_reject_garbage() {
    let ok: &[(&str, &[&str])] = &[
        ("gfx906", &["gfx906"]),
        (" gfx906 , gfx928,", &["gfx906", "gfx928"]),
        ("gfx906,gfx906,gfx926", &["gfx906", "gfx926"]),
        (
            "gfx906:xnack-,gfx90a:sramecc+:xnack-",
            &["gfx906:xnack-", "gfx90a:sramecc+:xnack-"],
        ),
    ];
    for (input, want) in ok {
        let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(parse_arch_list(input), Ok(want), "{input:?}");
    }
    for bad in [
        "",
        " , ",
        "sm_80",
        "gfx",
        "gfx90z",
        "gfx906:xnack",
        "gfx906;gfx908",
        "GFX906",
    ] {
        let err = parse_arch_list(bad).unwrap_err();
        assert!(err.to_string().contains("HIPK_ARCH"), "{bad:?}: {err}");
    }
    assert_eq!(arch_processor("gfx906:xnack-"), "gfx906");
    assert_eq!(arch_processor("gfx936"), "gfx936");
    assert_eq!(
        DCU_ARCHS,
        ["gfx906", "gfx926", "gfx928", "gfx936", "gfx938"]
    );
    for var in [
        "HIPK_HIPCC",
        "HIPCC",
        "ROCM_PATH",
        "HIP_PATH",
        "HIPK_ARCH",
        "PATH",
    ] {
        assert!(ENV_VARS.contains(&var), "{var} must trigger a rebuild");
    }
}

fn usage(vgprs: u32, sgprs: u32, lds_bytes: u32, occupancy: u32) -> ResourceUsage {
    ResourceUsage {
        vgprs,
        sgprs,
        scratch_bytes: 0,
        vgpr_spills: 0,
        sgpr_spills: 0,
        lds_bytes,
        occupancy,
    }
}

#[test]
fn text_remarks_from_hipcc_parse() {
    // Verbatim stderr of hipcc 5.2 (clang 15) for a two-kernel file, source echo included.
    let stderr = include_str!("fixtures/remarks.stderr");
    let records: Vec<_> = parse_remarks(stderr)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        records,
        vec![
            ("scale_f32".to_string(), usage(30, 27, 256, 8)),
            ("scale_f16".to_string(), usage(30, 27, 256, 8))
        ]
    );
}

/// Device printf calls `__ockl_hostcall_internal`, a function that is not a kernel: its record
/// has every figure but LDS (as hipcc 5.2 prints it) and is no kernel's record, not a warning.
#[test]
fn a_device_function_record_without_lds_is_not_a_kernel() {
    let mut r = String::new();
    for (name, lds) in [("_Z6squarePi", true), ("__ockl_hostcall_internal", false)] {
        r += &format!(
            "f.hip:1:1: remark: Function Name: {name} [-Rpass-analysis=kernel-resource-usage]\n"
        );
        for label in [
            "SGPRs: 44",
            "VGPRs: 39",
            "ScratchSize [bytes/lane]: 160",
            "Occupancy [waves/SIMD]: 6",
            "SGPRs Spill: 0",
            "VGPRs Spill: 0",
        ] {
            r += &format!(
                "f.hip:1:1: remark:     {label} [-Rpass-analysis=kernel-resource-usage]\n"
            );
        }
        if lds {
            r += "f.hip:1:1: remark:     LDS Size [bytes/block]: 0 [-Rpass-analysis=kernel-resource-usage]\n";
        }
    }
    let records = parse_remarks(&r);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].as_ref().unwrap().0, "_Z6squarePi");
}

#[test]
fn incomplete_remarks_are_reported_with_the_missing_fields() {
    let r = "f.hip:1:1: remark: Function Name: k [-Rpass-analysis=kernel-resource-usage]\n\
             f.hip:1:1: remark:     VGPRs: 12 [-Rpass-analysis=kernel-resource-usage]\n\
             f.hip:1:1: remark:     ScratchSize [bytes/lane]: 16 [-Rpass-analysis=kernel-resource-usage]\n";
    let records = parse_remarks(r);
    assert_eq!(records.len(), 1);
    let err = records[0].clone().unwrap_err();
    assert_eq!(err.kernel, "k");
    assert_eq!(
        err.missing,
        [
            "sgprs",
            "vgpr_spills",
            "sgpr_spills",
            "lds_bytes",
            "occupancy"
        ]
    );
    assert!(err.to_string().contains("lds_bytes"), "{err}");
    // Non-remark lines and other passes are ignored.
    assert!(parse_remarks("warning: foo\nf.hip:1:1: remark: x [-Rpass=inline]\n").is_empty());
}

#[test]
fn spills_and_scratch_land_in_their_fields() {
    let r = "a: remark: Function Name: k [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     SGPRs: 104 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     VGPRs: 64 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     ScratchSize [bytes/lane]: 92 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     Occupancy [waves/SIMD]: 4 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     SGPRs Spill: 30 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     VGPRs Spill: 22 [-Rpass-analysis=kernel-resource-usage]\n\
             a: remark:     LDS Size [bytes/block]: 256 [-Rpass-analysis=kernel-resource-usage]\n";
    let (name, u) = parse_remarks(r).remove(0).unwrap();
    assert_eq!(name, "k");
    let want = ResourceUsage {
        vgprs: 64,
        sgprs: 104,
        scratch_bytes: 92,
        vgpr_spills: 22,
        sgpr_spills: 30,
        lds_bytes: 256,
        occupancy: 4,
    };
    assert_eq!(u, want);
}

#[test]
fn optimization_records_parse() {
    // hipcc 5.2's record for one gfx908 kernel (it also reports AGPRs, which are ignored).
    let yaml = include_str!("fixtures/scale-hip-amdgcn-amd-amdhsa-gfx908.opt.yaml");
    let records: Vec<_> = parse_opt_record_yaml(yaml)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        records,
        vec![("scale_f32".to_string(), usage(30, 27, 256, 8))]
    );
    assert!(parse_opt_record_yaml("--- !Passed\nPass: inline\nName: X\n...\n").is_empty());
}

#[test]
fn record_file_names_give_the_arch() {
    let cases = [
        (
            "layernorm-hip-amdgcn-amd-amdhsa-gfx906.opt.yaml",
            Some("gfx906"),
        ),
        ("a-b-hip-amdgcn-amd-amdhsa-gfx936.opt.yaml", Some("gfx936")),
        (
            "x-hip-amdgcn-amd-amdhsa--gfx906:xnack-.opt.yaml",
            Some("gfx906:xnack-"),
        ),
        ("x-hip-amdgcn-amd-amdhsa-.opt.yaml", None),
        ("layernorm.opt.yaml", None),
        ("layernorm-hip-amdgcn-amd-amdhsa-gfx906.yaml", None),
    ];
    for (name, want) in cases {
        assert_eq!(arch_from_opt_record_name(name), want, "{name}");
    }
}

#[test]
fn generated_file_embeds_bundles_and_rows() {
    let src = BuiltSource {
        name: "layernorm".into(),
        bundle_path: PathBuf::from("/out/layernorm.hsaco"),
        resources: vec![(
            "layernorm_fwd_f32".into(),
            "gfx906".into(),
            usage(50, 58, 128, 4),
        )],
    };
    let text = render_generated(
        Some("/usr/bin/hipcc"),
        "HIP version: 5.2",
        &["gfx906".into()],
        None,
        &[src],
    );
    assert!(
        text.contains("pub const HIPCC: Option<&str> = Some(\"/usr/bin/hipcc\");"),
        "{text}"
    );
    assert!(
        text.contains("pub const ARCHS: &[&str] = &[\"gfx906\"];"),
        "{text}"
    );
    assert!(
        text.contains("pub const NOT_BUILT: Option<&str> = None;"),
        "{text}"
    );
    assert!(
        text.contains(
            "Bundle { source: \"layernorm\", bytes: include_bytes!(\"/out/layernorm.hsaco\") }"
        ),
        "{text}"
    );
    assert!(text.contains("kernel: \"layernorm_fwd_f32\", arch: \"gfx906\", usage: ResourceUsage { vgprs: 50, sgprs: 58,"), "{text}");
    let none = render_generated(None, "", &[], Some("no \"hipcc\""), &[]);
    assert!(
        none.contains("pub const NOT_BUILT: Option<&str> = Some(\"no \\\"hipcc\\\"\");"),
        "{none}"
    );
    assert!(
        none.contains("pub const BUNDLES: &[Bundle] = &[\n];"),
        "{none}"
    );
    // Included in a private module, an item the crate does not read must not warn.
    for t in [&text, &none] {
        let lines: Vec<&str> = t.lines().collect();
        for (i, l) in lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.starts_with("pub const"))
        {
            assert_eq!(lines[i - 1], "#[allow(dead_code)]", "{l}");
        }
    }
}
