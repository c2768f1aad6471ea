//! `model.safetensors`: HF GPT-2 weights in, f32 weights (names without prefix) out.

use crate::config::GptConfig;
use crate::error::{read_regular, Result, TrainError};
use crate::params::{specs, Params};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Largest safetensors file read (GPT-2 XL in f32 is 6.5 GB).
const WEIGHTS_CAP: u64 = 16 << 30;

/// Where `--model PATH` points: the directory and the weights file.
pub fn model_paths(path: &Path) -> (PathBuf, PathBuf) {
    if path.is_dir() {
        (path.to_path_buf(), path.join("model.safetensors"))
    } else {
        let dir = path
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        (dir, path.to_path_buf())
    }
}

/// A tensor on the host: shape and f32 values.
pub type HostTensor = (Vec<usize>, Vec<f32>);

/// Every tensor of a safetensors file as f32 (f16/bf16 widened exactly), with its shape.
pub fn read_f32_tensors(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let bytes = read_regular(path, WEIGHTS_CAP)?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| TrainError::file(path, format!("is not a valid safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(TrainError::file(
                    path,
                    format!("tensor `{name}` has dtype {other:?}; only F32, F16 and BF16 are read"),
                ))
            }
        };
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

/// Largest safetensors header read (the format's own limit).
const HEADER_CAP: u64 = 100_000_000;

/// The tensor names in the header of the safetensors file `path`, read without its data.
fn header_names(path: &Path) -> Result<Vec<String>> {
    use std::io::Read;
    let invalid =
        |why: String| TrainError::file(path, format!("is not a valid safetensors file: {why}"));
    let (mut f, size) = crate::error::open_regular(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| invalid("shorter than the 8-byte header length".into()))?;
    let n = u64::from_le_bytes(len);
    if n > HEADER_CAP || n > size.saturating_sub(8) {
        return Err(invalid(format!(
            "header length {n} exceeds the file ({size} bytes) or the format's limit {HEADER_CAP}"
        )));
    }
    let mut header = Vec::new();
    f.take(n)
        .read_to_end(&mut header)
        .map_err(TrainError::io(path))?;
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| invalid(format!("header: {e}")))?;
    Ok(map
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k != "__metadata__")
        .collect())
}

/// Compare `n_layer` with the layers the header of `path` names, before any table of
/// `cfg.layers` entries is built or the tensors are read: a config claiming more layers than the
/// file holds costs O(header), not O(claim).
fn check_layers(path: &Path, cfg: &GptConfig) -> Result<()> {
    let held: BTreeSet<usize> = header_names(path)?
        .iter()
        .filter_map(|n| {
            let short = n.strip_prefix("transformer.").unwrap_or(n);
            short.strip_prefix("h.")?.split_once('.')?.0.parse().ok()
        })
        .collect();
    if held.len() == cfg.layers {
        return Ok(());
    }
    let range = match (held.first(), held.last()) {
        (Some(a), Some(b)) => format!(" (h.{a} … h.{b})"),
        _ => String::new(),
    };
    Err(TrainError::file(
        path,
        format!(
            "holds {} layers{range} but {} says `n_layer` = {}; the config and the weights must \
             describe the same model",
            held.len(),
            cfg.path.display(),
            cfg.layers
        ),
    ))
}

/// Load the parameters of `cfg` from `path`: names with or without `transformer.`, the
/// `attn.bias` / `attn.masked_bias` buffers ignored, a `lm_head.weight` checked equal to `wte`.
/// Any missing, unexpected, duplicated, misshapen or non-finite tensor is an error naming it.
pub fn load_params(path: &Path, cfg: &GptConfig) -> Result<Params<Vec<f32>>> {
    check_layers(path, cfg)?;
    let mut tensors = BTreeMap::new();
    let mut lm_head = None;
    for (name, t) in read_f32_tensors(path)? {
        let short = name
            .strip_prefix("transformer.")
            .unwrap_or(&name)
            .to_string();
        let layer_buffer = short
            .strip_prefix("h.")
            .and_then(|r| r.split_once('.'))
            .is_some_and(|(l, rest)| {
                l.parse::<usize>().is_ok_and(|l| l < cfg.layers)
                    && (rest == "attn.bias" || rest == "attn.masked_bias")
            });
        if layer_buffer {
            continue;
        }
        if short == "lm_head.weight" {
            lm_head = Some(t);
            continue;
        }
        if tensors.insert(short.clone(), (name.clone(), t)).is_some() {
            return Err(TrainError::file(
                path,
                format!("tensor `{short}` is present twice (with and without `transformer.`)"),
            ));
        }
    }
    let mut values = Vec::new();
    for spec in specs(cfg) {
        let Some((stored, (shape, data))) = tensors.remove(&spec.name) else {
            return Err(TrainError::file(
                path,
                format!(
                    "tensor `{}` (shape {:?}) is missing; config.json says {}",
                    spec.name,
                    spec.shape,
                    cfg.describe()
                ),
            ));
        };
        if shape != spec.shape {
            return Err(TrainError::file(
                path,
                format!(
                    "tensor `{stored}` has shape {shape:?} but config.json ({}) needs {:?}",
                    cfg.describe(),
                    spec.shape
                ),
            ));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(TrainError::file(
                path,
                format!("tensor `{stored}` holds {} at flat index {i}", data[i]),
            ));
        }
        values.push(data);
    }
    if let Some((name, _)) = tensors.into_iter().next() {
        return Err(TrainError::file(
            path,
            format!(
                "unexpected tensor `{name}` (not a GPT-2 parameter of {})",
                cfg.describe()
            ),
        ));
    }
    if let Some((shape, data)) = lm_head {
        if shape != [cfg.vocab, cfg.channels] || data != values[0] {
            return Err(TrainError::file(
                path,
                "tensor `lm_head.weight` differs from `wte.weight`; the trained GPT-2 ties them \
                 (remove lm_head.weight or make it equal)",
            ));
        }
    }
    Params::from_vec(values, cfg.layers)
}

/// Serialize named f32 tensors as safetensors bytes.
pub fn to_safetensors(tensors: &[(String, Vec<usize>, &[f32])]) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(data))
                .map_err(|e| TrainError::Op(format!("safetensors view of `{name}`: {e}")))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize(views, &Some(meta))
        .map_err(|e| TrainError::Op(format!("safetensors serialization: {e}")))
}

/// The parameters as safetensors bytes, names without prefix.
pub fn params_to_safetensors(params: &Params<Vec<f32>>, cfg: &GptConfig) -> Result<Vec<u8>> {
    let list: Vec<_> = specs(cfg)
        .into_iter()
        .zip(params.iter())
        .map(|(s, t)| (s.name, s.shape, t.as_slice()))
        .collect();
    to_safetensors(&list)
}

/// The sharded checkpoint's index file (HF's name).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Every tensor of the model in directory `dir` as f32 with its shape: `model.safetensors`, or
/// the shards `model.safetensors.index.json` lists (`weight_map`: tensor → file in `dir`).
/// With an index, a tensor missing from the shard it is mapped to, a tensor in a shard that
/// the index does not map there (or in two shards), and a shard outside `dir` are errors naming
/// them. Returns the tensors and the files read.
pub fn read_model_tensors(dir: &Path) -> Result<(BTreeMap<String, HostTensor>, Vec<PathBuf>)> {
    let index = dir.join(INDEX_FILE);
    if !index.exists() {
        let single = dir.join("model.safetensors");
        return Ok((read_f32_tensors(&single)?, vec![single]));
    }
    let bytes = read_regular(&index, CONFIG_INDEX_CAP)?;
    let raw: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| TrainError::file(&index, format!("is not valid JSON: {e}")))?;
    let map = raw
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| TrainError::file(&index, "has no `weight_map` object"))?;
    // Shard file → the tensors the index puts there.
    let mut shards: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            TrainError::file(
                &index,
                format!("`weight_map` maps `{tensor}` to {file}, not a file name"),
            )
        })?;
        let plain = Path::new(file)
            .file_name()
            .is_some_and(|n| n == std::ffi::OsStr::new(file));
        if !plain || file == ".." || file == "." {
            return Err(TrainError::file(
                &index,
                format!(
                    "`weight_map` maps `{tensor}` to `{file}`, which is not a file in {}",
                    dir.display()
                ),
            ));
        }
        shards
            .entry(file.to_string())
            .or_default()
            .insert(tensor.clone());
    }
    let mut out = BTreeMap::new();
    let mut files = Vec::new();
    for (file, listed) in &shards {
        let path = dir.join(file);
        let tensors = read_f32_tensors(&path)?;
        for name in listed {
            if !tensors.contains_key(name) {
                return Err(TrainError::file(
                    &path,
                    format!("has no tensor `{name}`, which {INDEX_FILE} maps to this shard"),
                ));
            }
        }
        for (name, t) in tensors {
            if !listed.contains(&name) {
                let where_ = match map.get(&name).and_then(|f| f.as_str()) {
                    Some(other) => format!("maps it to `{other}` (a tensor in two shards)"),
                    None => "does not list it".to_string(),
                };
                return Err(TrainError::file(
                    &path,
                    format!("holds tensor `{name}` but {INDEX_FILE} {where_}"),
                ));
            }
            out.insert(name, t);
        }
        files.push(path);
    }
    Ok((out, files))
}

/// Largest index file read (real ones are tens of KB).
const CONFIG_INDEX_CAP: u64 = 64 << 20;

/// Take the tensors `specs` names (in that order) out of `tensors`, checking each shape and
/// that every value is finite; a missing, misshapen, non-finite or (left over) unexpected
/// tensor is an error naming it and `what` (the file or files read).
pub fn take_strict(
    what: &Path,
    mut tensors: BTreeMap<String, HostTensor>,
    specs: &[crate::params::Spec],
    describe: &str,
) -> Result<Vec<Vec<f32>>> {
    let mut values = Vec::with_capacity(specs.len());
    for spec in specs {
        let Some((shape, data)) = tensors.remove(&spec.name) else {
            return Err(TrainError::file(
                what,
                format!(
                    "tensor `{}` (shape {:?}) is missing; config.json says {describe}",
                    spec.name, spec.shape
                ),
            ));
        };
        if shape != spec.shape {
            return Err(TrainError::file(
                what,
                format!(
                    "tensor `{}` has shape {shape:?} but config.json ({describe}) needs {:?}",
                    spec.name, spec.shape
                ),
            ));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(TrainError::file(
                what,
                format!("tensor `{}` holds {} at flat index {i}", spec.name, data[i]),
            ));
        }
        values.push(data);
    }
    if let Some((name, _)) = tensors.into_iter().next() {
        return Err(TrainError::file(
            what,
            format!("unexpected tensor `{name}` (not a parameter of {describe})"),
        ));
    }
    Ok(values)
}
