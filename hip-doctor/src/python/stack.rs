//! torch's build, the DTK / ROCm version each wheel was built for against the installed one,
//! and the pairings between the packages (`Requires-Dist`, Hygon's `torchNNN` build tags).

use std::str::FromStr;

use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{MarkerEnvironment, MarkerEnvironmentBuilder, Requirement, VersionOrUrl};

use super::dist::{normalise, Dist, TorchVersionPy};
use super::Context;
use crate::report::Item;

/// The name of the torch build row.
pub const BUILD_ROW: &str = "torch build";

/// What a torch wheel was built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Build {
    /// NVIDIA CUDA (`version.cuda` set).
    Cuda(String),
    /// CPU only (neither set).
    Cpu,
    /// AMD ROCm (`version.hip` set, no DTK tag); the ROCm version from the label or `hip`.
    Rocm(String),
    /// Hygon DTK (`version.hip` set and a `dtkNNNN` tag); the DTK version (`25.04`).
    Dtk(Option<String>),
}

impl Build {
    /// `CUDA 13.2`, `CPU`, `ROCm 6.2`, `DTK 25.04`.
    pub fn describe(&self) -> String {
        match self {
            Build::Cuda(v) => format!("CUDA {v}"),
            Build::Cpu => "CPU".into(),
            Build::Rocm(v) => format!("ROCm {v}"),
            Build::Dtk(Some(v)) => format!("DTK {v}"),
            Build::Dtk(None) => "DTK (version not in its label)".into(),
        }
    }
}

/// The local version label: `2.4.1+das.opt2.dtk2504` → `das.opt2.dtk2504`.
pub fn local_label(version: &str) -> &str {
    version.split_once('+').map_or("", |(_, l)| l)
}

/// The DTK version of a `dtkNNNN` tag in a label: `das.opt1.dtk2604` → `26.04`.
pub fn dtk_tag(label: &str) -> Option<String> {
    label.split(['.', '_', '-']).find_map(|part| {
        let digits = part.strip_prefix("dtk")?;
        (digits.len() == 4 && digits.bytes().all(|b| b.is_ascii_digit()))
            .then(|| format!("{}.{}", &digits[..2], &digits[2..]))
    })
}

/// The torch of a Hygon `torchNNN` tag: `…dtk2604.torch251` → `251`.
pub fn torch_tag(label: &str) -> Option<&str> {
    label.split(['.', '_', '-']).find_map(|part| {
        let digits = part.strip_prefix("torch")?;
        (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(digits)
    })
}

/// `major.minor` of a version text: `6.2.41133-dd7f95766` → `6.2`.
pub fn major_minor(version: &str) -> Option<String> {
    let mut parts = version.split(['.', '-', '+']);
    let (major, minor) = (parts.next()?, parts.next()?);
    (major.parse::<u32>().is_ok() && minor.parse::<u32>().is_ok())
        .then(|| format!("{major}.{minor}"))
}

/// The build of a torch, from `version.py` and its version's label.
pub fn torch_build(v: &TorchVersionPy, version: &str) -> Build {
    let label = local_label(v.version.as_deref().unwrap_or(version)).to_string()
        + "."
        + local_label(version);
    let hip = v.hip.as_deref().or(v.rocm.as_deref());
    match (hip, v.cuda.as_deref()) {
        (Some(hip), _) => {
            if label.contains("das") || label.contains("dtk") {
                Build::Dtk(dtk_tag(&label))
            } else {
                let rocm = label
                    .split('.')
                    .zip(label.split('.').skip(1))
                    .find_map(|(a, b)| a.strip_prefix("rocm").map(|m| format!("{m}.{b}")))
                    .or_else(|| major_minor(hip))
                    .unwrap_or_else(|| hip.to_string());
                Build::Rocm(rocm)
            }
        }
        (None, Some(cuda)) => Build::Cuda(cuda.to_string()),
        (None, None) => Build::Cpu,
    }
}

/// The torch build row, and the DTK / ROCm agreement rows.
pub fn build_rows(ctx: &Context, torch: &Dist, v: &TorchVersionPy) -> (Build, Vec<Item>) {
    let version = v.version.clone().unwrap_or_else(|| torch.version.clone());
    let build = torch_build(v, &version);
    let what = format!(
        "torch {version}: a {} build (version.py: cuda {}, hip {})",
        build.describe(),
        v.cuda.as_deref().unwrap_or("None"),
        v.hip.as_deref().unwrap_or("None"),
    );
    let wanted = match &ctx.installed.dtk {
        Some(dtk) => format!(
            "DTK {dtk}'s torch (a `+das…dtk{}` wheel)",
            dtk.replace('.', "")
        ),
        None => "DTK's torch for the installed DTK (a `+das…dtkNNNN` wheel)".into(),
    };
    let mut rows = Vec::new();
    let row = match (&build, ctx.amd_node()) {
        (Build::Cuda(_) | Build::Cpu, Some(why)) => Item::fail(
            BUILD_ROW,
            format!("{what}; this node's GPU is AMD/Hygon ({why}): this torch cannot use it, torch.cuda.is_available() is False and training runs on the CPU"),
        )
        .with_hint(format!(
            "uninstall it and install {wanted}, e.g. from the DTK/DAS wheel index, never plain `pip install torch`"
        )),
        (Build::Cuda(_) | Build::Cpu, None) => Item::info(
            BUILD_ROW,
            format!("{what}; no AMD/Hygon GPU here (none found, no --arch): on a DCU this torch could not use the card"),
        ),
        _ => Item::pass(BUILD_ROW, what),
    };
    rows.push(
        row.with_fact("build", build.describe())
            .with_fact("version", version.clone()),
    );
    rows.extend(agreement_row(ctx, &build, v));
    (build, rows)
}

/// The name of the torch DTK/ROCm agreement row.
pub const AGREEMENT_ROW: &str = "torch vs installed DTK/ROCm";

fn agreement_row(ctx: &Context, build: &Build, v: &TorchVersionPy) -> Option<Item> {
    let installed = &ctx.installed;
    let hip_mm = v.hip.as_deref().and_then(major_minor);
    let runtime_mm = installed.hip_runtime.as_deref().and_then(major_minor);
    let item = match build {
        Build::Cuda(_) | Build::Cpu => return None,
        Build::Dtk(tag) => match (tag, &installed.dtk, &installed.rocm) {
            (Some(built), Some(have), _) if built != have => Item::fail(
                AGREEMENT_ROW,
                format!("torch was built for DTK {built}; the installed DTK is {have} ({}): DTK, driver and torch must match", installed.dtk_source),
            )
            .with_hint(format!("install DTK {have}'s torch, or use a node (or container) with DTK {built}")),
            (Some(built), Some(have), _) => Item::pass(
                AGREEMENT_ROW,
                format!("torch built for DTK {built}; DTK {have} installed ({})", installed.dtk_source),
            ),
            (_, None, Some(rocm)) => Item::fail(
                AGREEMENT_ROW,
                format!("torch is a DTK build, but this node has ROCm {rocm} and no DTK"),
            )
            .with_hint("use ROCm's torch here, or DTK's torch on a DCU node with DTK"),
            (_, None, None) => Item::warn(
                AGREEMENT_ROW,
                format!("torch is a {} build; no DTK install was found to compare with (looked for {})", build.describe(), installed.looked),
            )
            .with_hint("on the node that will train: install DTK (or source its env.sh) and run the doctor there"),
            (None, Some(have), _) => Item::warn(
                AGREEMENT_ROW,
                format!("torch is a DTK build without a dtkNNNN tag; the installed DTK is {have}: which DTK it needs is not known"),
            ),
        },
        Build::Rocm(rocm) => match (&installed.dtk, &installed.rocm) {
            (Some(dtk), _) => Item::warn(
                AGREEMENT_ROW,
                format!("torch is ROCm {rocm}'s build; this node has DTK {dtk}: ROCm's wheels need ROCm's libraries and archs (see the library rows)"),
            )
            .with_hint(format!("install DTK {dtk}'s torch")),
            (None, Some(have)) if major_minor(have) != major_minor(rocm) => Item::fail(
                AGREEMENT_ROW,
                format!("torch was built for ROCm {rocm}; ROCm {have} is installed"),
            )
            .with_hint(format!("install torch built for ROCm {}", major_minor(have).unwrap_or_default())),
            (None, Some(have)) => Item::pass(AGREEMENT_ROW, format!("torch built for ROCm {rocm}; ROCm {have} installed")),
            (None, None) => Item::warn(AGREEMENT_ROW, format!("torch is ROCm {rocm}'s build; no DTK or ROCm install was found to compare with")),
        },
    };
    let item = match (hip_mm, runtime_mm) {
        (Some(h), Some(r)) if h != r && item.status != crate::report::Status::Fail => {
            let detail = format!(
                "{}; its version.hip {} differs from the HIP runtime found ({})",
                item.detail,
                v.hip.as_deref().unwrap_or(""),
                installed.hip_runtime.as_deref().unwrap_or("")
            );
            Item {
                detail,
                status: crate::report::Status::Warn,
                ..item
            }
        }
        _ => item,
    };
    Some(item)
}

/// The name of a pairing row: `torchvision → torch`.
pub fn pairing_row(from: &str, to: &str) -> String {
    format!("{from} → {to}")
}

/// The environment markers are evaluated in: this interpreter's version (else 3.10) on Linux.
fn marker_env(python_version: Option<&str>) -> Option<MarkerEnvironment> {
    let full = python_version.unwrap_or("3.10.0");
    let short = major_minor(full).unwrap_or_else(|| "3.10".into());
    MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
        implementation_name: "cpython",
        implementation_version: full,
        os_name: "posix",
        platform_machine: std::env::consts::ARCH,
        platform_python_implementation: "CPython",
        platform_release: "",
        platform_system: "Linux",
        platform_version: "",
        python_full_version: full,
        python_version: &short,
        sys_platform: "linux",
    })
    .ok()
}

/// The pairing rows: each watched package's `Requires-Dist` on another watched package that is
/// installed, and each Hygon `torchNNN` tag against the installed torch.
pub fn pairing_rows(dists: &[Dist], python_version: Option<&str>) -> Vec<Item> {
    let env = marker_env(python_version);
    let mut rows = Vec::new();
    for dist in dists {
        let binary = !dist.libraries.is_empty();
        for line in &dist.requires {
            let Ok(req) = Requirement::<pep508_rs::VerbatimUrl>::from_str(line) else {
                continue;
            };
            let target_key = normalise(req.name.as_ref());
            let Some(target) = dists.iter().find(|d| d.key == target_key) else {
                continue;
            };
            if let Some(env) = &env {
                if !req.evaluate_markers(env, &[]) {
                    continue;
                }
            }
            let Some(VersionOrUrl::VersionSpecifier(spec)) = &req.version_or_url else {
                continue;
            };
            rows.push(judge_pair(dist, target, spec, binary));
        }
        let label = local_label(&dist.version);
        if let (Some(tag), Some(torch)) =
            (torch_tag(label), dists.iter().find(|d| d.key == "torch"))
        {
            if dist.key != "torch" {
                rows.push(judge_torch_tag(dist, torch, tag));
            }
        }
    }
    rows
}

fn judge_pair(dist: &Dist, target: &Dist, spec: &VersionSpecifiers, binary: bool) -> Item {
    let name = pairing_row(&dist.name, &target.name);
    let Ok(installed) = Version::from_str(&target.version) else {
        return Item::warn(
            name,
            format!(
                "{} {} is not a PEP 440 version",
                target.name, target.version
            ),
        );
    };
    let facts = |item: Item| {
        item.with_fact("requires", spec.to_string())
            .with_fact("installed", target.version.clone())
    };
    if spec.contains(&installed) {
        return facts(Item::pass(
            name,
            format!(
                "{} {} requires {} {spec}; {} is installed",
                dist.name, dist.version, target.name, target.version
            ),
        ));
    }
    let detail = format!(
        "{} {} requires {} {spec}, but {} {} is installed",
        dist.name, dist.version, target.name, target.name, target.version
    );
    let crash = matches!(dist.key.as_str(), "torchvision" | "torchaudio") && target.key == "torch";
    let item = if crash {
        Item::fail(name, detail).with_hint(format!(
            "{} built for another torch crashes at import (segmentation fault or undefined symbol): install the {} built for torch {}",
            dist.name, dist.name, target.version
        ))
    } else if binary {
        Item::fail(name, detail).with_hint(format!(
            "its compiled extensions are built against that {}: install the {} built for {} {}",
            target.name, dist.name, target.name, target.version
        ))
    } else {
        Item::warn(name, detail).with_hint(format!(
            "install a {} whose requirements allow {} {}",
            dist.name, target.name, target.version
        ))
    };
    facts(item)
}

fn judge_torch_tag(dist: &Dist, torch: &Dist, tag: &str) -> Item {
    let name = format!("{} build tag", dist.name);
    let release = torch.version.split('+').next().unwrap_or("");
    let parts: Vec<&str> = release.split('.').collect();
    let full: String = parts.iter().take(3).copied().collect();
    let short: String = parts.iter().take(2).copied().collect();
    if tag == full || tag == short {
        Item::pass(
            name,
            format!(
                "{} {} is tagged torch{tag}; torch {} is installed",
                dist.name, dist.version, torch.version
            ),
        )
    } else {
        Item::fail(
            name,
            format!(
                "{} {} is built for torch{tag}, but torch {} is installed",
                dist.name, dist.version, torch.version
            ),
        )
        .with_hint(format!(
            "install the {} built for torch {release} (a `…torch{full}` wheel)",
            dist.name
        ))
    }
}

/// The DTK tag of every other watched package against the installed DTK.
pub fn dtk_tag_rows(ctx: &Context, dists: &[Dist]) -> Vec<Item> {
    let Some(have) = &ctx.installed.dtk else {
        return Vec::new();
    };
    dists
        .iter()
        .filter(|d| d.key != "torch")
        .filter_map(|d| {
            let built = dtk_tag(local_label(&d.version))?;
            let name = format!("{} vs installed DTK", d.name);
            Some(if &built == have {
                Item::pass(
                    name,
                    format!(
                        "{} {} built for DTK {built}; DTK {have} installed",
                        d.name, d.version
                    ),
                )
            } else {
                Item::fail(
                    name,
                    format!(
                        "{} {} was built for DTK {built}; the installed DTK is {have}",
                        d.name, d.version
                    ),
                )
                .with_hint(format!("install the {} built for DTK {have}", d.name))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_tags() {
        assert_eq!(dtk_tag("das.opt2.dtk2504").as_deref(), Some("25.04"));
        assert_eq!(
            dtk_tag("das.opt1.dtk2604.torch251").as_deref(),
            Some("26.04")
        );
        assert_eq!(dtk_tag("cu121"), None);
        assert_eq!(torch_tag("das.opt1.dtk2604.torch251"), Some("251"));
        assert_eq!(major_minor("6.2.41133-dd7f95766").as_deref(), Some("6.2"));
        let v = |version: &str, cuda: Option<&str>, hip: Option<&str>| TorchVersionPy {
            version: Some(version.into()),
            cuda: cuda.map(Into::into),
            hip: hip.map(Into::into),
            rocm: None,
        };
        assert_eq!(
            torch_build(
                &v("2.4.1+das.opt2.dtk2504", None, Some("6.3.25024")),
                "2.4.1+das.opt2.dtk2504"
            ),
            Build::Dtk(Some("25.04".into()))
        );
        assert_eq!(
            torch_build(
                &v("2.4.1+rocm6.1", None, Some("6.1.40091-a8dbc0c19")),
                "2.4.1+rocm6.1"
            ),
            Build::Rocm("6.1".into())
        );
        assert_eq!(
            torch_build(&v("2.15.0+cu132", Some("13.2"), None), "2.15.0"),
            Build::Cuda("13.2".into())
        );
        assert_eq!(torch_build(&v("2.4.0", None, None), "2.4.0"), Build::Cpu);
    }
}
