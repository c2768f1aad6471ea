//! The LLaMA family's files, without running the model: config.json in both rotary spellings and
//! its errors, single and sharded weights and theirs, the uint32 token file, the packed batch's
//! counted targets, and a checkpoint written and read back (tests/data/train_llama).

use super::Scratch;
use crate::config::ModelConfig;
use crate::data::{Batch, Tokens};
use crate::llama::{checkpoint, weights, Family, Layout, LlamaConfig};
use hip_kernels::ops::rope::RopeScaling;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// tests/data/train_llama.
pub(super) fn llama_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/train_llama")
}

fn raw(model: &str) -> Value {
    serde_json::from_slice(&std::fs::read(llama_dir().join(model).join("config.json")).unwrap())
        .unwrap()
}

fn parse(v: Value) -> crate::error::Result<LlamaConfig> {
    match ModelConfig::from_value(Path::new("config.json"), v)? {
        ModelConfig::Llama(c) => Ok(c),
        ModelConfig::Gpt2(_) => panic!("parsed as GPT-2"),
    }
}

fn err(v: Value) -> String {
    match ModelConfig::from_value(Path::new("config.json"), v) {
        Ok(c) => panic!("accepted: {c:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_fixtures_configs_read_as_their_families() {
    let l = parse(raw("llama")).unwrap();
    assert_eq!(l.family, Family::Llama);
    assert_eq!(
        (l.vocab, l.channels, l.inner, l.layers, l.heads, l.kv_heads, l.head_dim),
        (128, 48, 96, 2, 4, 2, 16)
    );
    assert!(!l.tied && !l.biases.qkv && !l.biases.o && !l.biases.mlp);
    assert_eq!(l.eps, 1e-5);
    assert_eq!(l.rotary.theta, 10000.0);
    assert_eq!(
        l.rotary.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32.0
        }
    );
    let q = parse(raw("qwen2")).unwrap();
    assert_eq!(q.family, Family::Qwen2);
    assert_eq!((q.kv_heads, q.head_dim, q.tied), (1, 8, true));
    assert!(q.biases.qkv && !q.biases.o && !q.biases.mlp);
    assert_eq!(q.rotary.theta, 1e6);
    assert_eq!(q.rotary.scaling, RopeScaling::Default);
    assert_eq!(q.describe(), "qwen2 L=2 C=32 H=4 K=1 D=8 F=64 V=128");
}

#[test]
fn both_rotary_spellings_give_the_same_model() {
    let old = raw("llama");
    let mut new = old.clone();
    let o = new.as_object_mut().unwrap();
    let mut params = o.remove("rope_scaling").unwrap();
    o.remove("rope_theta");
    params["rope_theta"] = json!(10000.0);
    o.insert("rope_parameters".into(), params);
    let (a, b) = (parse(old.clone()).unwrap(), parse(new).unwrap());
    assert_eq!(a.rotary, b.rotary);
    // `type` is the older spelling of `rope_type` inside rope_scaling.
    let mut typed = old;
    let s = typed["rope_scaling"].as_object_mut().unwrap();
    let kind = s.remove("rope_type").unwrap();
    s.insert("type".into(), kind);
    assert_eq!(parse(typed).unwrap().rotary, a.rotary);
    // No rotary keys at all: θ 10000, no scaling.
    let mut bare = raw("qwen2");
    bare.as_object_mut().unwrap().remove("rope_parameters");
    let c = parse(bare).unwrap();
    assert_eq!(
        (c.rotary.theta, c.rotary.scaling),
        (10000.0, RopeScaling::Default)
    );
}

#[test]
fn config_errors_name_the_key() {
    let with = |model: &str, key: &str, v: Value| {
        let mut r = raw(model);
        r[key] = v;
        err(r)
    };
    let e = with("llama", "model_type", json!("mistral"));
    assert!(
        e.contains("mistral") && e.contains("gpt2, llama, qwen2"),
        "{e}"
    );
    let e = with("llama", "num_key_value_heads", json!(3));
    assert!(e.contains("num_key_value_heads") && e.contains('3'), "{e}");
    let e = with("llama", "hidden_act", json!("gelu"));
    assert!(e.contains("hidden_act"), "{e}");
    let e = with("qwen2", "use_sliding_window", json!(true));
    assert!(e.contains("use_sliding_window"), "{e}");
    let e = with("llama", "partial_rotary_factor", json!(0.5));
    assert!(e.contains("partial_rotary_factor"), "{e}");
    let e = with("llama", "num_hidden_layers", json!(0));
    assert!(e.contains("num_hidden_layers"), "{e}");
    let e = with("llama", "head_dim", json!(15));
    assert!(e.contains("head_dim"), "{e}");
    let mut r = raw("llama");
    r["rope_scaling"]["rope_type"] = json!("yarn");
    let e = err(r);
    assert!(
        e.contains("rope_scaling.rope_type") && e.contains("yarn"),
        "{e}"
    );
    let mut r = raw("llama");
    r["rope_scaling"].as_object_mut().unwrap().remove("factor");
    let e = err(r);
    assert!(e.contains("rope_scaling.factor"), "{e}");
    let mut r = raw("qwen2");
    r["rope_parameters"]["rope_theta"] = json!(-1.0);
    let e = err(r);
    assert!(e.contains("rope_parameters.rope_theta"), "{e}");
    let mut r = raw("llama");
    r.as_object_mut().unwrap().remove("intermediate_size");
    let e = err(r);
    assert!(e.contains("intermediate_size"), "{e}");
}

#[test]
fn single_and_sharded_weights_load_in_the_canonical_order() {
    for model in ["llama", "qwen2"] {
        let cfg = parse(raw(model)).unwrap();
        let layout = Layout::new(&cfg);
        let w = weights::load(&llama_dir().join(model), &cfg).unwrap();
        assert_eq!(w.len(), layout.specs.len());
        for (s, t) in layout.specs.iter().zip(&w) {
            assert_eq!(t.len(), s.shape.iter().product::<usize>(), "{}", s.name);
        }
        assert_eq!(
            w.iter().map(Vec::len).sum::<usize>(),
            layout.count(),
            "{model}"
        );
    }
    // qwen2: biases on q, k, v only; tied (no lm_head); llama: untied, no biases.
    let q = Layout::new(&parse(raw("qwen2")).unwrap());
    assert!(q.lm_head.is_none());
    assert!(q.layers[0].bias[..3].iter().all(Option::is_some));
    assert!(q.layers[0].bias[3..].iter().all(Option::is_none));
    let l = Layout::new(&parse(raw("llama")).unwrap());
    assert!(l.lm_head.is_some() && l.layers[1].bias.iter().all(Option::is_none));
    assert_eq!(
        l.specs[l.layers[1].weight[0]].name,
        "model.layers.1.self_attn.q_proj.weight"
    );
    assert_eq!(l.specs[l.layers[1].weight[0]].shape, [64, 48]);
}

/// A copy of the sharded qwen2 directory whose index `edit` changes.
fn edited_index(s: &Scratch, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let src = llama_dir().join("qwen2");
    let dir = s.path("qwen2");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let idx = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&idx, serde_json::to_vec(&v).unwrap()).unwrap();
    dir
}

#[test]
fn sharded_index_errors_name_the_tensor_or_shard() {
    let cfg = parse(raw("qwen2")).unwrap();
    let s = Scratch::new("llama-index");
    let first = "model-00001-of-00002.safetensors";
    let second = "model-00002-of-00002.safetensors";
    // A tensor the index maps to the other shard: in a shard the index does not map it to.
    let dir = edited_index(&s, |v| {
        v["weight_map"]["model.embed_tokens.weight"] = json!(second);
    });
    let e = weights::load(&dir, &cfg).unwrap_err().to_string();
    assert!(e.contains("model.embed_tokens.weight"), "{e}");
    // A tensor the index does not list.
    let s2 = Scratch::new("llama-index2");
    let dir = edited_index(&s2, |v| {
        v["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove("model.norm.weight");
    });
    let e = weights::load(&dir, &cfg).unwrap_err().to_string();
    assert!(
        e.contains("model.norm.weight") && e.contains("does not list"),
        "{e}"
    );
    // A shard outside the directory.
    let s3 = Scratch::new("llama-index3");
    let dir = edited_index(&s3, |v| {
        v["weight_map"]["model.norm.weight"] = json!(format!("../{first}"));
    });
    let e = weights::load(&dir, &cfg).unwrap_err().to_string();
    assert!(e.contains("not a file in"), "{e}");
    // A shard that does not exist.
    let s4 = Scratch::new("llama-index4");
    let dir = edited_index(&s4, |v| {
        v["weight_map"]["model.norm.weight"] = json!("model-00003-of-00002.safetensors");
    });
    let e = weights::load(&dir, &cfg).unwrap_err().to_string();
    assert!(e.contains("model-00003-of-00002.safetensors"), "{e}");
}

#[test]
fn a_config_that_disagrees_with_the_weights_names_the_tensor() {
    let mut r = raw("llama");
    r["num_key_value_heads"] = json!(4);
    let cfg = parse(r).unwrap();
    let e = weights::load(&llama_dir().join("llama"), &cfg)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.0.self_attn.k_proj.weight"), "{e}");
    // Untied config over weights without lm_head: missing.
    let mut r = raw("qwen2");
    r["tie_word_embeddings"] = json!(false);
    let cfg = parse(r).unwrap();
    let e = weights::load(&llama_dir().join("qwen2"), &cfg)
        .unwrap_err()
        .to_string();
    assert!(e.contains("lm_head.weight") && e.contains("missing"), "{e}");
    // Tied config over weights with a (different) lm_head.
    let mut r = raw("llama");
    r["tie_word_embeddings"] = json!(true);
    let cfg = parse(r).unwrap();
    let e = weights::load(&llama_dir().join("llama"), &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("lm_head.weight") && e.contains("tie_word_embeddings"),
        "{e}"
    );
}

#[test]
fn uint32_and_uint16_token_files_hold_the_same_ids() {
    let d = llama_dir();
    let a = Tokens::load(&d.join("tokens_u32.bin"), 128).unwrap();
    let b = Tokens::load(&d.join("tokens_u16.bin"), 128).unwrap();
    assert_eq!(a.ids.len(), 4096);
    assert_eq!(a.ids, b.ids);
    let e = Tokens::load(&d.join("tokens_u32.bin"), 100)
        .unwrap_err()
        .to_string();
    assert!(e.contains("vocab_size is 100"), "{e}");
    // A LLaMA-3 magic with GPT-2's version: named.
    let s = Scratch::new("llama-tokens");
    let mut bytes = std::fs::read(d.join("tokens_u32.bin")).unwrap();
    bytes[4..8].copy_from_slice(&1i32.to_le_bytes());
    let p = s.path("bad.bin");
    std::fs::write(&p, &bytes).unwrap();
    let e = Tokens::load(&p, 128).unwrap_err().to_string();
    assert!(e.contains("version 1") && e.contains("20240801"), "{e}");
    // uint32 ids: a file of the right length for uint16 is the wrong length for uint32.
    bytes[4..8].copy_from_slice(&7i32.to_le_bytes());
    bytes.truncate(1024 + 2 * 4096);
    std::fs::write(&p, &bytes).unwrap();
    let e = Tokens::load(&p, 128).unwrap_err().to_string();
    assert!(e.contains("4096 tokens"), "{e}");
}

#[test]
fn a_packed_batch_counts_its_targets() {
    let b = Batch {
        inputs: vec![1, 2, 3, 0, 4, 5],
        targets: vec![-100, 3, 7, -100, -100, 6],
        positions: Some(vec![0, 1, 2, 0, 0, 1]),
        cu_seqlens: Some(vec![0, 3, 4, 6]),
    };
    assert_eq!(b.counted(0..6), 3);
    assert_eq!(b.counted(0..3), 2);
    assert_eq!(b.counted(3..6), 1);
    assert_eq!(Batch::stream(vec![1, 2], vec![2, 3]).counted(0..2), 2);
    // A rank's rows: everything cut, the boundaries inside re-based, the ends added.
    let r = b.rows(3..6);
    assert_eq!(r.inputs, [0, 4, 5]);
    assert_eq!(r.targets, [-100, -100, 6]);
    assert_eq!(r.positions, Some(vec![0, 0, 1]));
    assert_eq!(r.cu_seqlens, Some(vec![0, 1, 3]));
    let first = b.rows(0..3);
    assert_eq!(first.cu_seqlens, Some(vec![0, 3]));
    assert_eq!(
        Batch::stream(vec![1, 2], vec![2, 3]).rows(1..2).cu_seqlens,
        None
    );
}

#[test]
fn a_checkpoint_reads_back_what_was_saved() {
    let cfg = parse(raw("qwen2")).unwrap();
    let params = weights::load(&llama_dir().join("qwen2"), &cfg).unwrap();
    let m: Vec<Vec<f32>> = params
        .iter()
        .map(|t| t.iter().map(|x| x * 0.5).collect())
        .collect();
    let v: Vec<Vec<f32>> = params
        .iter()
        .map(|t| t.iter().map(|x| x * x).collect())
        .collect();
    let state = crate::checkpoint::TrainerState {
        format: crate::checkpoint::FORMAT.into(),
        step: 3,
        loader_pos: 192,
        data_tokens: 4096,
        loss_scale: 1.0,
        scale_clean_steps: 0,
        adam_steps: 3,
        batch: 4,
        seq: 16,
        grad_accum: 1,
        dtype: crate::cli::Precision::F32,
        lr: 1e-2,
        lr_min: None,
        warmup: 0,
        steps: 10,
        adamw: [0.9, 0.999, 1e-8, 0.0, 0.0],
    };
    let s = Scratch::new("llama-ckpt");
    let dir = checkpoint::save(
        &s.0,
        &checkpoint::Snapshot {
            config: &cfg,
            params: &params,
            exp_avg: &m,
            exp_avg_sq: &v,
            state: &state,
        },
    )
    .unwrap();
    assert!(dir.join("config.json").exists() && dir.join("model.safetensors").exists());
    let r = checkpoint::load(&dir, &cfg).unwrap();
    assert_eq!((r.params, r.exp_avg, r.exp_avg_sq), (params, m, v));
    assert_eq!(r.state.step, 3);
    // Tied: the file has no lm_head (transformers ties it back).
    let names = crate::weights::read_f32_tensors(&dir.join("model.safetensors")).unwrap();
    assert!(!names.contains_key("lm_head.weight"));
    assert!(names.contains_key("model.layers.1.self_attn.k_proj.bias"));
    // Another model's checkpoint is refused.
    let other = parse(raw("llama")).unwrap();
    let e = checkpoint::load(&dir, &other).unwrap_err().to_string();
    assert!(e.contains("another model"), "{e}");
}
