//! SFT with ChatGLM3's SentencePiece tokenizer and LLaMA-Factory's `chatglm3` template (the
//! default for a tokenizer.model directory): the examples the SFT path builds are
//! LLaMA-Factory 0.9.5's (tests/data/chatglm3_tok/sft.jsonl, tools/chatglm3_tok_ref.py), and a
//! ChatGLM3-layout LoRA run on alpaca-style data (tests/data/train_glm/sft) trains, evaluates
//! and resumes through the same packing path as tokenizer.json.

use super::glm_train::glm_dir;
use super::{args_with, strs, Scratch};
use crate::cli::Args;
use crate::sft::record::{parse, Record};
use crate::sft::SftTokenizer;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// tests/data/chatglm3_tok.
fn tok_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/chatglm3_tok")
}

/// The README's run: LoRA r=8 on query_key_value of the tiny ChatGLM3-layout model, alpaca
/// lines, held-out loss every 4 steps; `extra` appended.
pub(super) fn chatglm_sft_args(extra: &[&str]) -> Args {
    let sft = glm_dir().join("sft");
    let mut flags = strs(&[
        "--tokenizer",
        &tok_dir().join("tokenizer").display().to_string(),
        "--eval-data",
        &sft.join("eval.jsonl").display().to_string(),
        "--eval-every",
        "4",
        "--seq",
        "64",
        "--cutoff-len",
        "65",
        "--batch",
        "2",
        "--steps",
        "8",
        "--lr",
        "2e-2",
        "--lora-rank",
        "8",
        "--lora-alpha",
        "16",
    ]);
    flags.extend(strs(extra));
    args_with(
        &glm_dir().join("chatglm_sft"),
        &sft.join("alpaca.jsonl"),
        &flags,
    )
}

#[test]
fn the_sft_path_gives_llamafactorys_chatglm3_ids_and_labels() {
    let tok = SftTokenizer::load(&tok_dir().join("tokenizer")).unwrap();
    assert!(tok.chatglm3().is_some());
    let text = std::fs::read_to_string(tok_dir().join("sft.jsonl")).unwrap();
    let mut checked = 0;
    for (i, line) in text.lines().enumerate() {
        let case: Value = serde_json::from_str(line).unwrap();
        let record = serde_json::to_string(&case["record"]).unwrap();
        let Record::Messages(messages) = parse(Path::new("sft.jsonl"), i as u64 + 1, &record)
            .unwrap_or_else(|e| panic!("line {}: {e}", i + 1))
        else {
            panic!("line {}: empty", i + 1)
        };
        let cutoff = case["cutoff_len"].as_u64().unwrap() as usize;
        let ex = crate::sft::example::encode(&tok, &messages, cutoff).unwrap();
        let want = |k: &str| -> Vec<i64> {
            case[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_i64().unwrap())
                .collect()
        };
        let ids: Vec<i64> = ex.ids.iter().map(|&x| x as i64).collect();
        let labels: Vec<i64> = ex.labels.iter().map(|&x| x as i64).collect();
        assert_eq!(ids, want("ids"), "line {}: ids", i + 1);
        assert_eq!(labels, want("labels"), "line {}: labels", i + 1);
        assert!(ex.full_len >= ex.ids.len());
        checked += 1;
    }
    assert!(checked >= 50, "{checked} examples");
    // Previews read the pieces back.
    assert_eq!(tok.decode(&[601, 603]), "[gMASK]sop");
}

#[test]
fn template_flags_are_checked_against_the_tokenizer_directory() {
    let e = crate::train::run(&chatglm_sft_args(&["--template", "chatml"]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--template chatml") && e.contains("chatglm3"),
        "{e}"
    );
    // chatglm3 is the default of such a directory; naming it changes nothing.
    let named = crate::train::run(&chatglm_sft_args(&[
        "--template",
        "chatglm3",
        "--steps",
        "1",
    ]))
    .unwrap();
    let default = crate::train::run(&chatglm_sft_args(&["--steps", "1"])).unwrap();
    assert_eq!(named[0].loss, default[0].loss);
    // A tokenizer.json directory renders with its own chat_template.
    let mut a = chatglm_sft_args(&["--template", "chatglm3"]);
    a.tokenizer =
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/sft/tokenizer_chatml"));
    let e = crate::train::run(&a).unwrap_err().to_string();
    assert!(e.contains("needs a ChatGLM3 tokenizer directory"), "{e}");
}

#[test]
fn chatglm3_lora_sft_trains_evaluates_and_resumes_on_the_cpu() {
    let s = Scratch::new("chatglm3-sft");
    let ck = s.path("ck");
    let ck_s = ck.display().to_string();
    let whole = crate::train::run(&chatglm_sft_args(&[
        "--checkpoint-dir",
        &ck_s,
        "--save-every",
        "4",
    ]))
    .unwrap();
    assert_eq!(whole.len(), 8);
    // B = 0 at the start: step 1 is the base model's loss; the adapters then lower it.
    let full = crate::train::run(&{
        let mut a = chatglm_sft_args(&["--steps", "1"]);
        a.lora_rank = 0;
        a.lora_alpha = None;
        a
    })
    .unwrap();
    assert_eq!(whole[0].loss, full[0].loss);
    assert!(whole[7].loss < whole[0].loss, "{whole:?}");
    let step4 = ck.join("step_4");
    assert!(step4.join("adapter_model.safetensors").is_file());
    let state: Value =
        serde_json::from_slice(&std::fs::read(step4.join("sft_data.json")).unwrap()).unwrap();
    let model = tok_dir().join("tokenizer/tokenizer.model");
    let sha = crate::sft::jsonl::sha256_files(&[&model], 1 << 20).unwrap();
    assert_eq!(state["tokenizer_sha256"].as_str(), Some(sha.as_str()));
    // Resumed at step 4: the same steps 5..=8.
    let mut again = chatglm_sft_args(&[]);
    again.resume = Some(step4.clone());
    let resumed = crate::train::run(&again).unwrap();
    assert_eq!(resumed.len(), 4);
    for (r, w) in resumed.iter().zip(&whole[4..]) {
        assert_eq!((r.step, r.loss), (w.step, w.loss));
    }
    // Another tokenizer.model is refused by its fingerprint.
    let other = s.path("tok");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::copy(&model, other.join("tokenizer.model")).unwrap();
    let mut a = chatglm_sft_args(&[]);
    a.resume = Some(step4);
    a.tokenizer = Some(other.clone());
    // The same bytes elsewhere resume fine (the fingerprint is the file's, not its path).
    assert_eq!(crate::train::run(&a).unwrap().len(), 4);
    std::fs::copy(
        tok_dir().join("variant_suffix.model"),
        other.join("tokenizer.model"),
    )
    .unwrap();
    let e = crate::train::run(&a).unwrap_err().to_string();
    assert!(e.contains("tokenizer"), "{e}");
}
