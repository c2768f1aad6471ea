#!/usr/bin/env python3
"""Fixtures of the trainer's SFT data path (docs/SFT.md), made with Hugging Face's own code.

Writes tests/data/sft/:
  tokenizer_chatml/      tokenizer.json (a byte-level BPE trained here with the `tokenizers`
                         package, ChatML special tokens) + tokenizer_config.json (ChatML template)
  tokenizer_sysprompt/   the same tokenizer.json, a ChatML template with a default system prompt,
                         `bos_token`, `trim`, `loop.first`/`loop.last` and `raise_exception`
  train.jsonl            the examples: alpaca with and without input and system, multi-turn
                         conversations, CJK, emoji, long examples cut by --cutoff-len, a
                         conversation without an assistant turn (dropped), an empty line
  eval.jsonl             a few held-out examples
  expected_<tok>.json    per example: the ids transformers' PreTrainedTokenizerFast +
                         apply_chat_template give, the labels of the incremental rendering rule,
                         the cut; then the rows packed for --seq, as the spec defines them

The Rust tests (train/src/sft/tests) compare their own ids, labels and rows with these.
Run from the repository root: /path/to/venv/bin/python tools/sft_ref.py
"""

import json
import os
import shutil

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "sft")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CUTOFF = 96
SEQ = 128

CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SYSPROMPT = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] | trim + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be first') }}
        {%- endif %}
    {%- elif message.role in ['user', 'assistant'] %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content | trim + '<|im_end|>\\n' }}
    {%- endif %}
    {%- if loop.last and add_generation_prompt %}
        {{- '<|im_start|>assistant\\n' }}
    {%- endif %}
{%- endfor %}
"""

LOREM = (
    "The quick brown fox jumps over the lazy dog while the committee reviews the budget. "
    "Gradient descent moves the weights a small step against the gradient of the loss. "
)
CJK = "机器学习是人工智能的一个分支。今日は良い天気ですね。한국어 문장도 있습니다。"
EMOJI = "Great job 🎉👍🏽! Family: 👨‍👩‍👧‍👦, flags 🇩🇪🇯🇵, hearts ❤️💙."


def examples():
    """The training lines, as Python objects (None: an empty line)."""
    out = []
    topics = ["photosynthesis", "binary search", "the water cycle", "compound interest",
              "recursion", "tides", "vaccines", "the stock market", "prime numbers", "rainbows"]
    for i, t in enumerate(topics):
        out.append({"instruction": f"Explain {t} in one sentence.",
                    "output": f"{t.capitalize()} is explained in sentence number {i + 1}."})
    for i, t in enumerate(topics[:8]):
        out.append({"instruction": "Translate the text to French.", "input": f"I like {t}.",
                    "output": f"J'aime {t} ({i})."})
    for i, t in enumerate(topics[:6]):
        out.append({"instruction": f"Summarise {t}.", "input": "",
                    "output": f"Summary {i}: {t} matters.",
                    "system": "You are a terse tutor."})
    for i in range(6):
        out.append({"system": f"  Answer in {i + 2} words.  ",
                    "instruction": f"What is {i} + {i}?", "input": f"({i}+{i})",
                    "output": f"It is {2 * i}."})
    for i in range(8):
        msgs = []
        if i % 2 == 0:
            msgs.append({"role": "system", "content": "You are a patient math teacher."})
        for turn in range(2 + i % 3):
            msgs.append({"role": "user", "content": f"Question {turn} of chat {i}: what is {turn} * {i}?"})
            msgs.append({"role": "assistant", "content": f"{turn} * {i} = {turn * i}."})
        out.append({"messages": msgs})
    for i in range(6):
        out.append({"instruction": f"用中文回答第{i}个问题：{CJK[: 10 + i]}",
                    "output": CJK[i:] + f" 答案是{i}。"})
    for i in range(5):
        out.append({"messages": [
            {"role": "user", "content": f"Cheer me up {i} 🙂"},
            {"role": "assistant", "content": EMOJI[: 20 + 5 * i] + " ✨"},
            {"role": "user", "content": "More please 🙏"},
            {"role": "assistant", "content": "🎈" * (i + 1) + " enjoy!"},
        ]})
    # Long examples: cut by --cutoff-len (in the answer, and one cut inside the prompt: dropped).
    for i in range(4):
        out.append({"instruction": f"Write a long paragraph number {i}.",
                    "output": LOREM * (2 + i)})
    out.append({"instruction": "Repeat this: " + LOREM * 4, "output": "Done."})
    out.append({"messages": [
        {"role": "user", "content": "Tell me a long story."},
        {"role": "assistant", "content": LOREM * 3},
        {"role": "user", "content": "Another?"},
        {"role": "assistant", "content": "No."},
    ]})
    # No assistant turn: dropped and counted.
    out.append({"messages": [{"role": "user", "content": "Anyone there?"}]})
    out.insert(12, None)
    # Whitespace around content (trimmed by the second template, kept by the first).
    out.append({"instruction": "  padded question  ", "output": "\n padded answer \n"})
    return out


def eval_examples():
    return [
        {"instruction": "Explain gravity in one sentence.", "output": "Gravity pulls masses together."},
        {"instruction": "Translate the text to French.", "input": "I like tides.", "output": "J'aime les marées."},
        {"messages": [{"role": "user", "content": "2 * 3?"}, {"role": "assistant", "content": "6."}]},
        {"instruction": "用中文说你好", "output": "你好！😊"},
    ]


def to_messages(rec):
    """The spec's record → messages rule."""
    if "messages" in rec:
        return rec["messages"]
    msgs = []
    if rec.get("system"):
        msgs.append({"role": "system", "content": rec["system"]})
    user = rec["instruction"]
    if rec.get("input"):
        user += "\n" + rec["input"]
    msgs.append({"role": "user", "content": user})
    msgs.append({"role": "assistant", "content": rec["output"]})
    return msgs


def train_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    corpus = []
    for rec in examples() + eval_examples():
        if rec is not None:
            corpus += [m["content"] for m in to_messages(rec)]
    corpus += [LOREM, CJK, EMOJI, "system user assistant You are a helpful assistant."] * 3
    tok.train_from_iterator(corpus, trainer)
    return tok


def write_tokenizer(tok, name, template):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "pad_token": "<|endoftext|>",
        "model_max_length": 4096,
        "chat_template": template,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1, ensure_ascii=False)
    return d


def encode_example(hf, msgs):
    """ids and labels of one example by the spec's incremental rule, with transformers."""
    def enc(ms, gen):
        text = hf.apply_chat_template(ms, tokenize=False, add_generation_prompt=gen)
        ids = hf(text, add_special_tokens=False)["input_ids"]
        direct = hf.apply_chat_template(ms, tokenize=True, add_generation_prompt=gen, return_dict=False)
        assert list(direct) == ids, "apply_chat_template(tokenize=True) differs from encode(render)"
        return ids
    ids = enc(msgs, False)
    labels = [-100] * len(ids)
    for j, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        pre = enc(msgs[:j], True)
        assert ids[: len(pre)] == pre, "template does not render incrementally"
        b = len(enc(msgs[: j + 1], False))
        for t in range(len(pre), b):
            labels[t] = ids[t]
    return ids, labels


def pack(kept, seq, pad_id):
    """The spec's packing: examples in order, whole, a row takes them while they fit."""
    rows, cur = [], []

    def flush():
        inputs, targets, positions, cu = [], [], [], [0]
        for ids, labels in cur:
            n = len(ids) - 1
            inputs += ids[:n]
            targets += labels[1:]
            positions += list(range(n))
            cu.append(len(inputs))
        pad = seq - len(inputs)
        if pad:
            inputs += [pad_id] * pad
            targets += [-100] * pad
            positions += list(range(pad))
            cu.append(seq)
        rows.append({"inputs": inputs, "targets": targets, "positions": positions, "cu_seqlens": cu})

    used = 0
    for ids, labels in kept:
        n = len(ids) - 1
        if cur and used + n > seq:
            flush()
            cur, used = [], 0
        cur.append((ids, labels))
        used += n
    if cur:
        flush()
    return rows


def expected(hf, lines, cutoff, seq):
    out, kept = [], []
    pad_id = hf.pad_token_id if hf.pad_token_id is not None else 0
    for lineno, rec in lines:
        ids, labels = encode_example(hf, to_messages(rec))
        full = len(ids)
        ids, labels = ids[:cutoff], labels[:cutoff]
        dropped = all(x == -100 for x in labels)
        out.append({"line": lineno, "ids": ids, "labels": labels, "full_len": full, "dropped": dropped})
        if not dropped:
            kept.append((ids, labels))
    rows = pack(kept, seq, pad_id)
    real = sum(len(ids) - 1 for ids, _ in kept)
    return {
        "cutoff_len": cutoff, "seq": seq, "pad_id": pad_id,
        "examples": out, "rows": rows,
        "stats": {"read": len(out), "dropped": sum(e["dropped"] for e in out), "rows": len(rows),
                  "positions": len(rows) * seq, "padding": len(rows) * seq - real,
                  "counted": sum(sum(t != -100 for t in r["targets"]) for r in rows)},
    }


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write("" if r is None else json.dumps(r, ensure_ascii=False))
            f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    recs = examples()
    write_jsonl(os.path.join(OUT, "train.jsonl"), recs)
    write_jsonl(os.path.join(OUT, "eval.jsonl"), eval_examples())
    tok = train_tokenizer()
    lines = [(i + 1, r) for i, r in enumerate(recs) if r is not None]
    for name, template in [("chatml", CHATML), ("sysprompt", SYSPROMPT)]:
        d = write_tokenizer(tok, f"tokenizer_{name}", template)
        hf = PreTrainedTokenizerFast.from_pretrained(d)
        exp = expected(hf, lines, CUTOFF, SEQ)
        exp["eval"] = expected(hf, [(i + 1, r) for i, r in enumerate(eval_examples())], CUTOFF, SEQ)
        with open(os.path.join(OUT, f"expected_{name}.json"), "w") as f:
            json.dump(exp, f, ensure_ascii=False, separators=(",", ":"))
        s = exp["stats"]
        print(f"{name}: {s['read']} examples, {s['dropped']} dropped, {s['rows']} rows of {SEQ}, "
              f"padding {s['padding']}/{s['positions']}, counted {s['counted']}")




# ---- Training on SFT data: the float64 transformers reference -------------------------------
#
# A tiny LlamaForCausalLM whose vocabulary is the tokenizer's, trained on the ChatML rendering
# of train.jsonl packed as above, with the loss of every step divided by the step's count of
# counted targets over all its micro-batches (micro-batches of unequal counts with
# --grad-accum), each packed sequence run on its own (position ids from 0), and the held-out
# loss of eval.jsonl (counted-target mean, no gradients) after every EVAL_EVERY-th step and the
# last. Written: tests/data/sft/model/ and tests/data/sft/ref_train.jsonl (step lines, then
# eval lines `{"step", "eval_loss", "eval_tokens"}`); the run's flags in tests/data/sft/run.json.

RUN = {"template": "chatml", "cutoff_len": 64, "seq": 64, "batch": 2, "grad_accum": 2,
       "steps": 8, "lr": 1e-2, "eval_every": 4}


def tiny_model(vocab, out):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, max_position_embeddings=128, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, rope_theta=10000.0, hidden_act="silu",
                      bos_token_id=0, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    for extra in ["generation_config.json"]:
        p = os.path.join(out, extra)
        if os.path.exists(p):
            os.remove(p)


def rotary_f64(model, torch):
    """transformers computes the rotary angles in float32: the same frequencies in float64."""
    rot = model.model.rotary_emb
    d = model.config.head_dim
    params = getattr(model.config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(model.config, "rope_theta", 10000.0))
    assert params.get("rope_type", "default") == "default"
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    assert torch.allclose(inv, rot.inv_freq.to(torch.float64), rtol=1e-6, atol=0)

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = forward


def micro_batches(rows, batch, first_row, count):
    """`count` micro-batches of `batch` rows from global row `first_row` (rows cycle: epochs)."""
    out = []
    g = first_row
    for _ in range(count):
        mb = {"inputs": [], "targets": [], "positions": [], "cu_seqlens": [0]}
        for r in range(batch):
            row = rows[(g + r) % len(rows)]
            base = len(mb["inputs"])
            mb["inputs"] += row["inputs"]
            mb["targets"] += row["targets"]
            mb["positions"] += row["positions"]
            mb["cu_seqlens"] += [base + c for c in row["cu_seqlens"][1:]]
        out.append(mb)
        g += batch
    return out


def loss_sum(model, mb, torch):
    """Summed cross-entropy of a micro-batch's counted targets, each sequence alone."""
    import torch.nn.functional as F

    inputs = torch.tensor(mb["inputs"], dtype=torch.long)
    targets = torch.tensor(mb["targets"], dtype=torch.long)
    total = torch.zeros((), dtype=torch.float64)
    cu = mb["cu_seqlens"]
    for s, e in zip(cu[:-1], cu[1:]):
        if (targets[s:e] == -100).all():
            continue
        pos = torch.tensor(mb["positions"][s:e])[None]
        logits = model(input_ids=inputs[s:e][None], position_ids=pos, use_cache=False).logits[0]
        total = total + F.cross_entropy(logits.to(torch.float64), targets[s:e],
                                        ignore_index=-100, reduction="sum")
    return total


def train_reference():
    import torch
    from transformers import AutoModelForCausalLM

    tdir = os.path.join(OUT, f"tokenizer_{RUN['template']}")
    hf = PreTrainedTokenizerFast.from_pretrained(tdir)
    mdir = os.path.join(OUT, "model")
    tiny_model(len(hf), mdir)
    recs = examples()
    lines = [(i + 1, r) for i, r in enumerate(recs) if r is not None]
    train = expected(hf, lines, RUN["cutoff_len"], RUN["seq"])
    ev = expected(hf, [(i + 1, r) for i, r in enumerate(eval_examples())], RUN["cutoff_len"], RUN["seq"])
    torch.use_deterministic_algorithms(True)
    model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float64, attn_implementation="eager")
    rotary_f64(model, torch)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=RUN["lr"], betas=(0.9, 0.999), eps=1e-8, foreach=False)
    b, k = RUN["batch"], RUN["grad_accum"]
    log = []
    counts = []

    def evaluate(step):
        mbs = micro_batches(ev["rows"], b, 0, (len(ev["rows"]) + b - 1) // b)
        # Rows past the end of the eval set are padding: drop the wrapped ones.
        n_rows = len(ev["rows"])
        total, count = 0.0, 0
        with torch.no_grad():
            for i, mb in enumerate(mbs):
                keep = max(0, min(b, n_rows - i * b))
                t = RUN["seq"] * keep
                sub = {"inputs": mb["inputs"][:t], "targets": mb["targets"][:t],
                       "positions": mb["positions"][:t],
                       "cu_seqlens": [c for c in mb["cu_seqlens"] if c <= t]}
                total += loss_sum(model, sub, torch).item()
                count += sum(1 for y in sub["targets"] if y != -100)
        log.append({"step": step, "eval_loss": total / count, "eval_tokens": count})

    for s in range(1, RUN["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        mbs = micro_batches(train["rows"], b, (s - 1) * b * k, k)
        per_mb = [sum(1 for y in mb["targets"] if y != -100) for mb in mbs]
        counts.append(per_mb)
        count = sum(per_mb)
        loss_total = 0.0
        for mb in mbs:
            loss = loss_sum(model, mb, torch) / count
            loss.backward()
            loss_total += loss.item()
        norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()
        opt.step()
        log.append({"step": s, "loss": loss_total, "lr": RUN["lr"], "grad_norm": norm, "tokens": count})
        print(f"step {s}/{RUN['steps']} | loss {loss_total:.6f} | norm {norm:.4f} | tokens {count} {per_mb}")
        if s % RUN["eval_every"] == 0 or s == RUN["steps"]:
            evaluate(s)
            print(f"eval step {s} | eval_loss {log[-1]['eval_loss']:.6f} | eval_tokens {log[-1]['eval_tokens']}")
    assert any(len(set(c)) > 1 for c in counts), "micro-batches of equal counts only"
    with open(os.path.join(OUT, "ref_train.jsonl"), "w") as f:
        for rec in log:
            f.write(json.dumps(rec) + "\n")
    with open(os.path.join(OUT, "run.json"), "w") as f:
        json.dump(RUN, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
    train_reference()
