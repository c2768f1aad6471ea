//! The SFT data path against transformers (tests/data/sft, tools/sft_ref.py): ids, labels and
//! packed rows of every example, for a ChatML template and one with a default system prompt;
//! then the producer, resuming and every bad input.

use super::example::encode;
use super::feeder::{Feeder, RowMaker, Split};
use super::index::{example_of_line, SftIndex};
use super::jsonl::LineReader;
use super::pack::SftBatch;
use super::record::{parse, Record};
use super::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// tests/data/sft.
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/sft")
}

/// The expected figures of one tokenizer directory.
fn expected(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(dir().join(format!("expected_{name}.json"))).unwrap())
        .unwrap()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn tok(name: &str) -> Arc<SftTokenizer> {
    Arc::new(SftTokenizer::load(&dir().join(format!("tokenizer_{name}"))).unwrap())
}

/// Every example of `file` against `exp["examples"]`, then the rows against `exp["rows"]`.
fn check_against(name: &str, file: &str, exp: &Value) {
    let tok = tok(name);
    let path = dir().join(file);
    let cutoff = exp["cutoff_len"].as_u64().unwrap() as usize;
    let seq = exp["seq"].as_u64().unwrap() as usize;
    let examples = exp["examples"].as_array().unwrap();
    let mut seen = 0;
    let mut r = LineReader::open(&path).unwrap();
    while let Some(line) = r.next_line().unwrap() {
        let Some(ex) = example_of_line(&path, line.number, &line.text, &tok, cutoff).unwrap()
        else {
            continue;
        };
        let want = &examples[seen];
        seen += 1;
        assert_eq!(want["line"].as_u64().unwrap(), line.number);
        let Some(ex) = ex else {
            // No assistant turn: dropped (transformers' labels are all −100).
            assert!(want["dropped"].as_bool().unwrap(), "line {}", line.number);
            assert!(ints(&want["labels"]).iter().all(|&l| l == -100));
            continue;
        };
        let ids: Vec<i64> = ex.ids.iter().map(|&t| i64::from(t)).collect();
        assert_eq!(ids, ints(&want["ids"]), "{name} line {}: ids", line.number);
        let labels: Vec<i64> = ex.labels.iter().map(|&t| i64::from(t)).collect();
        assert_eq!(
            labels,
            ints(&want["labels"]),
            "{name} line {}: labels",
            line.number
        );
        assert_eq!(ex.full_len as u64, want["full_len"].as_u64().unwrap());
        assert_eq!(ex.is_dropped(), want["dropped"].as_bool().unwrap());
    }
    assert_eq!(seen, examples.len(), "{name}: examples seen");

    let index = SftIndex::build(&path, &tok, cutoff, seq).unwrap();
    let stats = &exp["stats"];
    assert_eq!(index.stats.read, stats["read"].as_u64().unwrap());
    assert_eq!(index.stats.dropped, stats["dropped"].as_u64().unwrap());
    assert_eq!(index.stats.rows, stats["rows"].as_u64().unwrap());
    assert_eq!(index.stats.padding, stats["padding"].as_u64().unwrap());
    assert_eq!(index.stats.counted, stats["counted"].as_u64().unwrap());
    assert_eq!(tok.pad_id as u64, exp["pad_id"].as_u64().unwrap());
    let rows = exp["rows"].as_array().unwrap();
    assert_eq!(rows.len(), index.rows.len());
    let mut maker = RowMaker::new(&path, Arc::clone(&tok));
    for (g, want) in rows.iter().enumerate() {
        let mut b = SftBatch::default();
        maker.push_row(&index, g as u64, &mut b).unwrap();
        let as64 = |v: &[i32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        assert_eq!(
            as64(&b.inputs),
            ints(&want["inputs"]),
            "{name} row {g}: inputs"
        );
        assert_eq!(
            as64(&b.targets),
            ints(&want["targets"]),
            "{name} row {g}: targets"
        );
        assert_eq!(
            as64(&b.positions),
            ints(&want["positions"]),
            "{name} row {g}: positions"
        );
        assert_eq!(
            as64(&b.cu_seqlens),
            ints(&want["cu_seqlens"]),
            "{name} row {g}: cu_seqlens"
        );
        assert_eq!(b.counted() as u32, index.row_counted[g]);
    }
}

#[test]
fn chatml_matches_transformers() {
    let exp = expected("chatml");
    assert!(exp["examples"].as_array().unwrap().len() >= 50);
    check_against("chatml", "train.jsonl", &exp);
    check_against("chatml", "eval.jsonl", &exp["eval"]);
}

#[test]
fn default_system_prompt_template_matches_transformers() {
    let exp = expected("sysprompt");
    check_against("sysprompt", "train.jsonl", &exp);
    check_against("sysprompt", "eval.jsonl", &exp["eval"]);
}

#[test]
fn fixture_covers_what_the_issue_lists() {
    // Long examples cut, one dropped by the cut, CJK and emoji, multi-turn: in the fixture.
    let exp = expected("chatml");
    let ex = exp["examples"].as_array().unwrap();
    let cut = ex
        .iter()
        .filter(|e| e["full_len"].as_u64() > exp["cutoff_len"].as_u64())
        .count();
    assert!(cut >= 5, "{cut} examples cut");
    assert!(ex
        .iter()
        .any(|e| e["dropped"].as_bool().unwrap()
            && e["full_len"].as_u64() > exp["cutoff_len"].as_u64()));
    let text = std::fs::read_to_string(dir().join("train.jsonl")).unwrap();
    assert!(text.contains('机') && text.contains('🎉') && text.contains("\"system\""));
}

/// The micro-batches one rank makes at global row `g`, by the sequential maker.
fn sequential(index: &SftIndex, tok: &Arc<SftTokenizer>, split: Split, g: u64) -> SftBatch {
    let mut m = RowMaker::new(&index.path, Arc::clone(tok));
    let mut b = SftBatch::default();
    m.micro_batch(index, split, g, &mut b).unwrap();
    b
}

#[test]
fn feeder_runs_ahead_in_order_across_epochs_and_ranks() {
    let tok = tok("chatml");
    let index = Arc::new(SftIndex::build(&dir().join("train.jsonl"), &tok, 96, 128).unwrap());
    let rows = index.rows.len() as u64;
    // Two ranks of 2 rows each == one rank of 4 rows, split in halves.
    let single = Split::single(4);
    let ranks = [0, 1].map(|rank| Split {
        batch: 2,
        world: 2,
        rank,
    });
    let start = rows - 3; // the first micro-batch straddles the epoch's end
    let mut whole: Feeder<SftBatch> = Feeder::start(
        Arc::clone(&index),
        Arc::clone(&tok),
        single,
        start,
        vec![SftBatch::default(); 3],
    )
    .unwrap();
    let mut per_rank: Vec<Feeder<SftBatch>> = ranks
        .iter()
        .map(|&s| {
            Feeder::start(
                Arc::clone(&index),
                Arc::clone(&tok),
                s,
                start,
                vec![SftBatch::default(); 2],
            )
            .unwrap()
        })
        .collect();
    for k in 0..(rows / 4 + 3) {
        let g = start + 4 * k;
        let w = whole.take().unwrap();
        assert_eq!(w.row, g);
        assert_eq!(w.slot, sequential(&index, &tok, single, g));
        assert_eq!(w.counted, index.counted_rows(g, 4));
        let half = w.slot.inputs.len() / 2;
        for (r, f) in per_rank.iter_mut().enumerate() {
            let p = f.take().unwrap();
            assert_eq!(p.slot.inputs[..], w.slot.inputs[r * half..(r + 1) * half]);
            assert_eq!(p.slot.targets[..], w.slot.targets[r * half..(r + 1) * half]);
            assert_eq!(p.slot.cu_seqlens.last().copied(), Some(half as i32));
            f.recycle(p.slot);
        }
        whole.recycle(w.slot);
    }
    assert!(whole.stats().taken > 0);
}

#[test]
fn resume_refuses_other_data_or_tokenizer() {
    let tok_a = tok("chatml");
    let tok_b = tok("sysprompt");
    let train = SftIndex::build(&dir().join("train.jsonl"), &tok_a, 96, 128).unwrap();
    let eval = SftIndex::build(&dir().join("eval.jsonl"), &tok_a, 96, 128).unwrap();
    let g = 2 * train.rows.len() as u64 + 5;
    let state = DataState::at(&train, &tok_a, g);
    assert_eq!((state.epoch, state.row), (2, 5));
    let back: DataState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(back.resume_row(&train, &tok_a).unwrap(), g);
    let e = back.resume_row(&eval, &tok_a).unwrap_err().to_string();
    assert!(
        e.contains("eval.jsonl") && e.contains("not the data"),
        "{e}"
    );
    let e = back.resume_row(&train, &tok_b).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_sysprompt") && e.contains("not the tokenizer"),
        "{e}"
    );
    let other_seq = SftIndex::build(&dir().join("train.jsonl"), &tok_a, 96, 256).unwrap();
    let e = back.resume_row(&other_seq, &tok_a).unwrap_err().to_string();
    assert!(e.contains("--seq 256") && e.contains("--seq 128"), "{e}");
}

#[test]
fn eval_split_covers_every_row_once() {
    let tok = tok("sysprompt");
    let index = SftIndex::build(&dir().join("train.jsonl"), &tok, 96, 128).unwrap();
    let all = eval::eval_batches(&index, Arc::clone(&tok), Split::single(1)).unwrap();
    let total: usize = all.iter().map(SftBatch::counted).sum();
    assert_eq!(total as u64, index.stats.counted);
    let mut split_total = 0;
    let mut lens = Vec::new();
    for rank in 0..3 {
        let b = eval::eval_batches(
            &index,
            Arc::clone(&tok),
            Split {
                batch: 2,
                world: 3,
                rank,
            },
        )
        .unwrap();
        lens.push(b.len());
        split_total += b.iter().map(SftBatch::counted).sum::<usize>();
        assert!(b.iter().all(|x| x.inputs.len() == 2 * 128));
    }
    assert_eq!(split_total, total);
    assert!(lens.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn preview_marks_trained_tokens() {
    let args = preview::PreviewArgs {
        data: dir().join("train.jsonl"),
        tokenizer: dir().join("tokenizer_chatml"),
        cutoff_len: 96,
        seq: 128,
        k: 2,
        mark: preview::Mark::Brackets,
    };
    let mut out = Vec::new();
    preview::run(&args, &mut out).unwrap();
    let s = String::from_utf8(out).unwrap();
    assert!(
        s.contains("<|im_start|>user\nExplain photosynthesis in one sentence.<|im_end|>\n<|im_start|>assistant\n[[Photosynthesis is explained in sentence number 1.<|im_end|>\n]]"),
        "{s}"
    );
    let exp = expected("chatml");
    let e0 = &exp["examples"][0];
    let n = ints(&e0["ids"]).len();
    let trained = ints(&e0["labels"]).iter().filter(|&&l| l != -100).count();
    assert!(
        s.contains(&format!("── line 1: {n} tokens, {trained} trained ──")),
        "{s}"
    );
    assert!(
        s.contains("57 examples read, 2 dropped (1 without an assistant turn)"),
        "{s}"
    );
    assert!(
        s.contains(&format!("{} rows of 128", exp["stats"]["rows"])),
        "{s}"
    );
}

// ---- bad input ----

/// A temporary directory holding `data` as data.jsonl.
fn with_data(data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("data.jsonl");
    std::fs::write(&p, data).unwrap();
    (d, p)
}

/// The error of indexing `data` with the ChatML tokenizer.
fn index_err(data: &[u8]) -> String {
    let (_d, p) = with_data(data);
    SftIndex::build(&p, &tok("chatml"), 96, 128)
        .unwrap_err()
        .to_string()
}

const GOOD: &str = r#"{"instruction": "hi", "output": "hello"}"#;

#[test]
fn malformed_json_names_line_and_column() {
    let e = index_err(format!("{GOOD}\n{{\"instruction\": \"a\", \"output\": }}\n").as_bytes());
    assert!(
        e.contains("data.jsonl:2:") && e.contains("malformed JSON"),
        "{e}"
    );
    let col: u64 = e.split(':').nth(2).unwrap().parse().unwrap();
    assert_eq!(col, 32, "{e}");
    assert!(e.contains("malformed JSON (expected value);"), "{e}");
}

#[test]
fn records_of_neither_format_or_bad_fields_are_errors() {
    let cases: [(&str, &str); 9] = [
        ("[1, 2]", "is a JSON array, not an object"),
        (
            r#"{"prompt": "a", "completion": "b"}"#,
            "neither a conversation nor an alpaca record",
        ),
        (r#"{"instruction": "a"}"#, "alpaca record without `output`"),
        (
            r#"{"instruction": 3, "output": "b"}"#,
            "`instruction` is a JSON number, not a string",
        ),
        (
            r#"{"instruction": "a", "output": "b", "input": ["x"]}"#,
            "`input` is a JSON array",
        ),
        (
            r#"{"messages": [{"role": "tool", "content": "x"}]}"#,
            "unknown role `tool`",
        ),
        (
            r#"{"messages": [{"role": "user"}]}"#,
            "messages[0] (user) has no `content`",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 1}]}"#,
            "messages[0].`content` is a JSON number",
        ),
        (r#"{"messages": "hi"}"#, "`messages` is a JSON string"),
    ];
    for (line, want) in cases {
        let e = index_err(format!("{GOOD}\n\n{line}\n").as_bytes());
        assert!(
            e.contains("data.jsonl:3: ") && e.contains(want),
            "{line}: {e}"
        );
    }
}

#[test]
fn conversation_without_assistant_is_dropped_and_counted() {
    let data = format!(
        "{GOOD}\n{}\n{GOOD}\n",
        r#"{"messages": [{"role": "user", "content": "x"}]}"#
    );
    let (_d, p) = with_data(data.as_bytes());
    let index = SftIndex::build(&p, &tok("chatml"), 96, 128).unwrap();
    assert_eq!(
        (
            index.stats.read,
            index.stats.dropped,
            index.stats.no_assistant
        ),
        (3, 1, 1)
    );
    assert_eq!(index.entries.len(), 2);
    let only = r#"{"messages": [{"role": "user", "content": "x"}]}"#;
    let e = index_err(format!("{only}\n").as_bytes());
    assert!(
        e.contains("holds no example to train on (1 read, 1 dropped"),
        "{e}"
    );
}

#[test]
fn invalid_utf8_names_line_and_column() {
    let mut data = format!("{GOOD}\n").into_bytes();
    data.extend_from_slice(b"{\"instruction\": \"ab\xff\", \"output\": \"c\"}\n");
    let e = index_err(&data);
    assert!(e.contains("data.jsonl:2:20: invalid UTF-8"), "{e}");
}

#[test]
fn a_huge_line_is_refused_with_bounded_memory() {
    // 1 GiB without a newline: a sparse file, read no further than the line limit.
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("huge.jsonl");
    let mut f = std::fs::File::create(&p).unwrap();
    std::io::Write::write_all(&mut f, format!("{GOOD}\n{{\"instruction\": \"").as_bytes()).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let mut r = LineReader::open(&p).unwrap().with_max_line(1 << 20);
    assert!(r.next_line().unwrap().is_some());
    let e = r.next_line().unwrap_err().to_string();
    assert!(
        e.contains("huge.jsonl:2: the line is longer than 1 MiB"),
        "{e}"
    );
}

#[test]
fn cutoff_above_seq_plus_one_is_a_usage_error() {
    let (_d, p) = with_data(GOOD.as_bytes());
    let e = SftIndex::build(&p, &tok("chatml"), 130, 128).unwrap_err();
    assert!(matches!(e, SftError::Usage(_)));
    assert!(
        e.to_string().contains("--cutoff-len 130 with --seq 128"),
        "{e}"
    );
    assert_eq!(crate::error::TrainError::from(e).exit_code(), 2);
    assert!(SftIndex::build(&p, &tok("chatml"), 129, 128).is_ok());
}

#[test]
fn ids_beyond_the_models_vocab_are_refused() {
    let tok = tok("chatml");
    let index = SftIndex::build(&dir().join("train.jsonl"), &tok, 96, 128).unwrap();
    let max = index.max_id.unwrap();
    assert!(index.check_vocab(max.id as usize + 1, tok.pad_id).is_ok());
    let e = index
        .check_vocab(max.id as usize, tok.pad_id)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("train.jsonl:{}:", max.line)) && e.contains("vocab_size"),
        "{e}"
    );
}

/// A copy of the ChatML tokenizer directory with `template` as its chat template.
fn tokenizer_with(template: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let src = dir().join("tokenizer_chatml");
    std::fs::copy(src.join("tokenizer.json"), d.path().join("tokenizer.json")).unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(src.join("tokenizer_config.json")).unwrap()).unwrap();
    cfg["chat_template"] = Value::from(template);
    std::fs::write(
        d.path().join("tokenizer_config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let p = d.path().to_path_buf();
    (d, p)
}

#[test]
fn template_that_does_not_render_incrementally_is_an_error() {
    // The generation prompt is not how the rendered assistant turn starts.
    let (_t, tdir) = tokenizer_with(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\nSure: {% endif %}",
    );
    let (_d, p) = with_data(format!("{GOOD}\n").as_bytes());
    let e = SftIndex::build(&p, &SftTokenizer::load(&tdir).unwrap(), 96, 128)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.jsonl:1: ") && e.contains("does not render incrementally"),
        "{e}"
    );
}

#[test]
fn template_errors_are_reported_with_the_line() {
    let (_t, tdir) = tokenizer_with(
        "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system \
         prompts here') }}{% endif %}{{ m.content }}{% endfor %}",
    );
    let data = format!(
        "{GOOD}\n{}\n",
        r#"{"instruction": "a", "output": "b", "system": "s"}"#
    );
    let (_d, p) = with_data(data.as_bytes());
    let e = SftIndex::build(&p, &SftTokenizer::load(&tdir).unwrap(), 96, 128)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.jsonl:2: ") && e.contains("no system prompts here"),
        "{e}"
    );
    let (_t2, bad) = tokenizer_with("{% for m in messages %}{{ m.content }");
    let e = SftTokenizer::load(&bad).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("does not compile"),
        "{e}"
    );
}

#[test]
fn python_string_methods_and_loop_variables_render() {
    let (_t, tdir) = tokenizer_with(
        "{{ bos_token }}{% for m in messages %}{% if loop.first %}[first]{% endif %}\
         {{ m.role.upper() }}:{{ m.content.strip() | trim }}{% if m.content.strip().startswith('h') %}(h){% endif %}\
         {% if not loop.last %}|{% endif %}{% endfor %}{{ eos_token }}",
    );
    let t = SftTokenizer::load(&tdir).unwrap();
    let Record::Messages(m) = parse(
        Path::new("x"),
        1,
        r#"{"instruction": " hi ", "output": "yo"}"#,
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!(
        t.render(&m, false).unwrap(),
        "<|endoftext|>[first]USER:hi(h)|ASSISTANT:yo<|im_end|>"
    );
}

#[test]
fn corrupt_or_missing_tokenizer_files_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let e = SftTokenizer::load(d.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json: not found"), "{e}");
    let src = dir().join("tokenizer_chatml");
    std::fs::copy(
        src.join("tokenizer_config.json"),
        d.path().join("tokenizer_config.json"),
    )
    .unwrap();
    let mut tj = std::fs::read(src.join("tokenizer.json")).unwrap();
    tj.truncate(tj.len() / 2);
    std::fs::write(d.path().join("tokenizer.json"), &tj).unwrap();
    let e = SftTokenizer::load(d.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json: is not a tokenizer"), "{e}");
    std::fs::copy(src.join("tokenizer.json"), d.path().join("tokenizer.json")).unwrap();
    std::fs::write(
        d.path().join("tokenizer_config.json"),
        b"{\"bos_token\": \"a\",\n  \"x\" 1}",
    )
    .unwrap();
    let e = SftTokenizer::load(d.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer_config.json:2:") && e.contains("malformed JSON"),
        "{e}"
    );
    std::fs::write(d.path().join("tokenizer_config.json"), b"{}").unwrap();
    let e = SftTokenizer::load(d.path()).unwrap_err().to_string();
    assert!(e.contains("has no `chat_template`"), "{e}");
}

#[test]
fn a_file_changed_under_the_producer_is_reported() {
    let data = format!("{GOOD}\n{GOOD}\n");
    let (_d, p) = with_data(data.as_bytes());
    let tok = tok("chatml");
    let index = SftIndex::build(&p, &tok, 96, 128).unwrap();
    std::fs::write(
        &p,
        format!(
            "{GOOD}\n{}\n",
            r#"{"instruction": "a much longer question than before", "output": "b"}"#
        ),
    )
    .unwrap();
    let mut m = RowMaker::new(&p, Arc::clone(&tok));
    let e = m
        .micro_batch(&index, Split::single(1), 0, &mut SftBatch::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.jsonl:2: the file changed"), "{e}");
}

#[test]
fn example_rule_on_a_two_turn_conversation() {
    // Directly: the second assistant turn is trained too, the user turn between is not.
    let tok = tok("chatml");
    let Record::Messages(m) = parse(
        Path::new("x"),
        1,
        r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}"#,
    )
    .unwrap() else {
        panic!()
    };
    let ex = encode(&tok, &m, 1000).unwrap();
    let marked = preview::marked(&tok, &ex, false);
    assert_eq!(
        marked,
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n[[b<|im_end|>\n]]\
         <|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n[[d<|im_end|>\n]]"
    );
}

#[test]
fn a_consumer_slower_than_the_producer_never_waits() {
    // The producer fills every slot while the consumer is busy (here: asleep); taking them then
    // waits for nothing. Recycled slots are filled again in the background.
    let tok = tok("chatml");
    let index = Arc::new(SftIndex::build(&dir().join("train.jsonl"), &tok, 96, 128).unwrap());
    let mut f: Feeder<SftBatch> = Feeder::start(
        Arc::clone(&index),
        Arc::clone(&tok),
        Split::single(2),
        0,
        vec![SftBatch::default(); 3],
    )
    .unwrap();
    for _ in 0..3 {
        std::thread::sleep(std::time::Duration::from_millis(1500));
        for _ in 0..3 {
            let fed = f.take().unwrap();
            f.recycle(fed.slot);
        }
    }
    let st = f.stats();
    assert_eq!(st.taken, 9);
    assert_eq!(st.waited, 0, "{st:?}");
}
