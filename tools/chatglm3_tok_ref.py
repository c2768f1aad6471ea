#!/usr/bin/env python3
"""Fixtures for hipk-train's native SentencePiece reader and its `--template chatglm3`.

Writes tests/data/chatglm3_tok/:
  tokenizer/tokenizer.model      a small SentencePiece BPE model trained here, with ChatGLM3's
                                 normalizer settings (identity, dummy prefix, spaces kept,
                                 byte fallback); tokenizer_config.json as ChatGLM3's
  variant_nfkc.model             BPE, nmt_nfkc precompiled charsmap, remove_extra_whitespaces,
                                 user-defined symbols, no byte fallback (unknown ids)
  variant_suffix.model           BPE, treat_whitespace_as_suffix, byte fallback, unused pieces
  plain.json                     {model file: [[text, ids], ...]} from sentencepiece's encode
  sft.jsonl                      one line per example: the record, its format, --cutoff-len,
                                 and the ids and labels LLaMA-Factory 0.9.5 produces with
                                 --template chatglm3 (train_on_prompt and mask_history off)

Run with a Python that has sentencepiece, transformers and llamafactory==0.9.5:
  python tools/chatglm3_tok_ref.py --tokenization-py PATH/tokenization_chatglm.py
PATH is a copy of THUDM's chatglm3-6b tokenization_chatglm.py (not committed: it is THUDM's
code); it is copied next to the model in a temporary directory so LLaMA-Factory loads the
tokenizer exactly as a user's ChatGLM3 directory (AutoTokenizer, trust_remote_code).
"""

import argparse
import json
import os
import random
import shutil
import sys
import tempfile

import sentencepiece as spm

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "data", "chatglm3_tok")

EN = [
    "The quick brown fox jumps over the lazy dog.",
    "Give three tips for staying healthy.",
    "Translate the following sentence into French.",
    "Write a short poem about the sea and the wind.",
    "What is the capital of France? Paris is the capital.",
    "Explain why the sky is blue in simple words.",
    "List the prime numbers below 30: 2, 3, 5, 7, 11, 13, 17, 19, 23, 29.",
    "In 2023 the company sold 1,234,567 units at $19.99 each.",
    "def add(a, b):\n    return a + b\n",
    "Summarize the text below in one sentence.",
]
ZH = [
    "你好，世界！今天天气很好。",
    "请给出保持健康的三个建议。",
    "将下面的句子翻译成英文。",
    "写一首关于大海和风的短诗。",
    "法国的首都是哪里？巴黎是法国的首都。",
    "用简单的话解释为什么天空是蓝色的。",
    "人工智能正在改变我们的生活和工作方式。",
    "北京时间2024年3月15日上午10点。",
    "深度学习模型需要大量的数据和计算资源。",
    "请总结下面这段文字的主要内容。",
]
EMOJI = ["😀", "🚀", "👍", "🎉", "❤️", "🇨🇳", "👨‍👩‍👧", "🐍"]


def corpus(seed=0, n=3000):
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 3)):
            k = rng.random()
            if k < 0.4:
                parts.append(rng.choice(EN))
            elif k < 0.8:
                parts.append(rng.choice(ZH))
            elif k < 0.9:
                parts.append(" ".join(str(rng.randint(0, 10**rng.randint(1, 6))) for _ in range(3)))
            else:
                parts.append(rng.choice(EMOJI) + " " + rng.choice(EN))
        lines.append(" ".join(parts))
    return lines


def train(path, **kw):
    import io

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=buf,
        model_type="bpe",
        num_threads=1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        **kw,
    )
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def plain_strings(seed):
    """Texts for plain encoding: edge cases, then random mixes of every script in the fixtures."""
    fixed = [
        "", " ", "  ", "\n", "\t", "a", " a", "a ", "  a  b  ", "a\nb", "\n\n", " \n ", "hello world",
        "Hello World", "HELLO", "12345", "3.14159", "2024-03-15", "１２３", "ｆｕｌｌ ｗｉｄｔｈ", "ﬁ ligature",
        "e\u0301", "é", "Å", "ß", "你好", "你好，世界", "中文 English 混合", "日本語のテキスト", "한국어",
        "Привет", "Γειά σου", "مرحبا", "😀", "😀😀", "👨‍👩‍👧", "🇨🇳🇺🇸", "❤️", "a😀b", "▁", "▁▁a",
        "<0x41>", "<s>", "</s>", "<unk>", "<x>", "a<x>b", "@@", "x@@y", "<|user|>", "[gMASK]", "sop",
        "\u200b", "\u3000全角空格", "tab\tsep", "trailing\n", "\r\n", "ÿ", "\u00a0nbsp", "~!@#$%^&*()_+",
        "def add(a, b):\n    return a + b\n", "    indented", "a  b   c    d", "✓ ✗ → ←", "½ ¼ ²",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\U0001F600\U0001F680", "Ω≈ç√∫", "中" * 40, "ab" * 50,
        "\x00", "a\x00b", "\ufeffbom", "\x7f\x01", "\U0010ffff", "\ufffd", "a\ufffdb", "\u2581\u2581 x",
    ]
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?-\n\t")
    alphabet += list("你好世界天气很今的是了我们在有人这中大为上个国和地到以说时要就出会也你对生能而子那得于着下自之")
    alphabet += ["😀", "🚀", "👍", "é", "ü", "ñ", "ｆ", "１", "，", "。", "！", "  ", "▁", "\u3000", "丂", "龘", "ꙮ"]
    out = list(fixed)
    for line in corpus(seed=seed + 1, n=60):
        out.append(line[: rng.randint(1, len(line))])
    while len(out) < 230:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))))
    return out


# --- SFT examples (alpaca and messages), some cut by --cutoff-len -------------------------------

SYS = "你是一个乐于助人的助手。"


def sft_examples():
    ex = []

    def alpaca(instruction, output, input_="", system=None, cutoff=1024):
        rec = {"instruction": instruction, "input": input_, "output": output}
        if system is not None:
            rec["system"] = system
        ex.append(("alpaca", rec, cutoff))

    def messages(msgs, cutoff=1024):
        ex.append(("messages", {"messages": [{"role": r, "content": c} for r, c in msgs]}, cutoff))

    for i in range(8):
        alpaca(EN[i], ZH[i])
        alpaca(ZH[i], EN[i], input_=EN[(i + 3) % len(EN)])
    for i in range(6):
        alpaca(ZH[i], ZH[(i + 1) % len(ZH)], system=SYS)
        alpaca(EN[i], EN[i + 1], input_=ZH[i], system="You are a helpful assistant.")
    alpaca("", "Only an input.", input_="请翻译：早上好")
    alpaca("Empty output", "")
    alpaca("Empty system is no system", "OK", system="")
    alpaca("数字 0123456789 与 12.5%", "答案是 42，不是 41。")
    alpaca("Emoji 😀🚀👍 and 🇨🇳", "Sure 🎉 ❤️ 👨‍👩‍👧")
    alpaca("Byte fallback: 龘 丂 ꙮ Ω≈ç√∫ 𝔘𝔫𝔦", "Rare: ÿ ½ ² ✓ → \u3000 end")
    alpaca("  leading and trailing spaces  ", "  kept?  ")
    alpaca("Line one\nLine two\n\nLine four", "def f(x):\n    return x * 2\n")
    alpaca("Template text {{idx}} and {{content}} in a query", "Reply with {{idx}}")
    alpaca("Literal specials: <|user|> [gMASK] sop </s> <unk> <|assistant|>", "Reply <|observation|> eop")
    for turns in range(2, 5):
        msgs = [("system", SYS)] if turns % 2 == 0 else []
        for t in range(turns):
            msgs.append(("user", ZH[(t + turns) % len(ZH)] + " " + EN[t % len(EN)]))
            msgs.append(("assistant", EN[(t + turns) % len(EN)] + " " + ZH[t % len(ZH)]))
        messages(msgs)
    messages([("user", "Hi 👋"), ("assistant", "Hello!"), ("user", "2+2=?"), ("assistant", "4")])
    messages([("system", "Answer in English."), ("user", "你好"), ("assistant", "Hello")])
    # Cut by --cutoff-len: in the first turn, and in a later one.
    long_en = " ".join(EN)
    long_zh = "".join(ZH)
    alpaca(long_en, long_zh, cutoff=32)
    alpaca(long_zh, "short", cutoff=24)
    alpaca("short", long_en, cutoff=24)
    alpaca(long_en, long_en, system=SYS, cutoff=40)
    alpaca("x", "y", cutoff=3)
    alpaca("x", "y", cutoff=1)
    for cutoff in (30, 48, 64, 80):
        messages(
            [("user", EN[0]), ("assistant", ZH[0]), ("user", long_en), ("assistant", long_zh),
             ("user", "third"), ("assistant", "done")],
            cutoff=cutoff,
        )
    messages([("system", long_zh), ("user", EN[1]), ("assistant", EN[2])], cutoff=20)
    messages([("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", long_en)], cutoff=25)
    return ex


def lf_encode(tok_dir, examples):
    """ids and labels from LLaMA-Factory 0.9.5's own converter, template and processor."""
    from llamafactory.data.converter import AlpacaDatasetConverter, SharegptDatasetConverter
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.hparams import DataArguments, ModelArguments
    from llamafactory.model import load_tokenizer

    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=tok_dir, trust_remote_code=True))["tokenizer"]
    alpaca_attr = DatasetAttr("file", "alpaca", formatting="alpaca")
    alpaca_attr.system = "system"
    share_attr = DatasetAttr("file", "messages", formatting="sharegpt")
    share_attr.messages, share_attr.role_tag, share_attr.content_tag = "messages", "role", "content"
    share_attr.user_tag, share_attr.assistant_tag, share_attr.system_tag = "user", "assistant", "system"
    out = []
    for fmt, rec, cutoff in examples:
        data_args = DataArguments(template="chatglm3", cutoff_len=cutoff)
        template = get_template_and_fix_tokenizer(tokenizer, data_args)
        conv = (AlpacaDatasetConverter if fmt == "alpaca" else SharegptDatasetConverter)(
            alpaca_attr if fmt == "alpaca" else share_attr, data_args
        )
        row = dict(rec)
        row.setdefault("system", None) if fmt == "alpaca" else None
        c = conv(row)
        proc = SupervisedDatasetProcessor(template=template, tokenizer=tokenizer, processor=None, data_args=data_args)
        batch = {k: [v] for k, v in c.items()}
        res = proc.preprocess_dataset(batch)
        ids, labels = res["input_ids"][0], res["labels"][0]
        out.append({"format": fmt, "record": rec, "cutoff_len": cutoff, "ids": ids, "labels": labels})
    info = {
        "added_tokens": {k: v for k, v in tokenizer.get_added_vocab().items()},
        "tokenizer_class": type(tokenizer).__name__,
        "transformers": __import__("transformers").__version__,
        "llamafactory": __import__("llamafactory").__version__,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "specials": {t: tokenizer.convert_tokens_to_ids(t) for t in
                     ["[MASK]", "[gMASK]", "[sMASK]", "sop", "eop", "<|system|>", "<|user|>", "<|assistant|>",
                      "<|observation|>"]},
    }
    return out, info


def stress(out_dir, tokenization_py, seed=7):
    """Larger random sets, not committed: 6000 strings per model and 400 random SFT examples.
    `HIPK_SPM_STRESS=out_dir cargo test -p hipk-train --lib spm:: -- --ignored` compares them."""
    rng = random.Random(seed)
    lines = corpus(seed=99, n=3000)
    alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?-\n\t'\"<>[]|/_@")
    alphabet += list("你好世界天气很今的是了我们在有人这中大为上个国和地到以说时要就出会也你对生能而子那得于着下自之首都法巴黎")
    alphabet += ["😀", "🚀", "👍", "é", "ü", "ñ", "ｆ", "１", "，", "。", "！", "  ", "▁", "\u3000", "丂", "龘", "ꙮ",
                 "<x>", "@@", "<|user|>", "<|observation|>", "{{idx}}", "{{content}}", "sop", "\u200d", "\ufe0f",
                 "ﬁ", "½", "Ⅻ", "㍿", "\u0301"]

    def text(long_share):
        if rng.random() < long_share:
            return " ".join(rng.choice(lines) for _ in range(rng.randint(1, 6)))
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))

    os.makedirs(out_dir, exist_ok=True)
    plain = {}
    for name in ["tokenizer/tokenizer.model", "variant_nfkc.model", "variant_suffix.model"]:
        sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, name))
        plain[name] = [[s, sp.encode(s)] for s in (text(0.33) for _ in range(6000))]
    with open(os.path.join(out_dir, "plain.json"), "w") as f:
        json.dump(plain, f, ensure_ascii=False)
    ex = []
    for _ in range(400):
        t = lambda: "" if rng.random() < 0.1 else text(0.5)
        cutoff = rng.choice([1, 2, 3, 5, 8, 13, 20, 33, 50, 80, 128, 1024])
        if rng.random() < 0.5:
            rec = {"instruction": t(), "input": t(), "output": t()}
            if rng.random() < 0.5:
                rec["system"] = t()
            ex.append(("alpaca", rec, cutoff))
        else:
            msgs = [{"role": "system", "content": t()}] if rng.random() < 0.5 else []
            for _ in range(rng.randint(1, 4)):
                msgs += [{"role": "user", "content": t()}, {"role": "assistant", "content": t()}]
            ex.append(("messages", {"messages": msgs}, cutoff))
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(OUT, "tokenizer", name), tmp)
        shutil.copy(tokenization_py, os.path.join(tmp, "tokenization_chatglm.py"))
        rows, _ = lf_encode(tmp, ex)
    with open(os.path.join(out_dir, "sft.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"stress: {sum(len(v) for v in plain.values())} strings, {len(rows)} SFT examples in {out_dir}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenization-py", help="THUDM chatglm3-6b's tokenization_chatglm.py (without it: "
                    "the models and plain.json only)")
    ap.add_argument("--stress", metavar="DIR", help="write the larger random sets (not committed) to DIR "
                    "from the committed models, and nothing else")
    args = ap.parse_args()
    if args.stress:
        if args.tokenization_py is None:
            ap.error("--stress needs --tokenization-py")
        stress(args.stress, args.tokenization_py)
        return 0
    tok_dir = os.path.join(OUT, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    main_model = os.path.join(tok_dir, "tokenizer.model")
    train(main_model, vocab_size=600, byte_fallback=True, normalization_rule_name="identity",
          add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
          allow_whitespace_only_pieces=True, character_coverage=0.9995)
    train(os.path.join(OUT, "variant_nfkc.model"), vocab_size=400, byte_fallback=False,
          normalization_rule_name="nmt_nfkc", remove_extra_whitespaces=True, character_coverage=0.98,
          user_defined_symbols=["<x>", "@@", "▁▁"], control_symbols=["<ctrl>"])
    train(os.path.join(OUT, "variant_suffix.model"), vocab_size=700, byte_fallback=True,
          normalization_rule_name="identity", treat_whitespace_as_suffix=True, remove_extra_whitespaces=False,
          character_coverage=0.99)
    mark_unused(os.path.join(OUT, "variant_suffix.model"))
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"remove_space": False, "do_lower_case": False, "tokenizer_class": "ChatGLMTokenizer",
                   "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]}}, f, indent=2)
        f.write("\n")

    plain = {}
    for i, name in enumerate(["tokenizer/tokenizer.model", "variant_nfkc.model", "variant_suffix.model"]):
        sp = spm.SentencePieceProcessor(model_file=os.path.join(OUT, name))
        plain[name] = [[s, sp.encode(s)] for s in plain_strings(seed=10 + i)]
    with open(os.path.join(OUT, "plain.json"), "w") as f:
        json.dump(plain, f, ensure_ascii=False, indent=0)
        f.write("\n")

    if args.tokenization_py is None:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tokenizer.model", "tokenizer_config.json"):
            shutil.copy(os.path.join(tok_dir, name), tmp)
        shutil.copy(args.tokenization_py, os.path.join(tmp, "tokenization_chatglm.py"))
        rows, info = lf_encode(tmp, sft_examples())
    sp = spm.SentencePieceProcessor(model_file=main_model)
    info["vocab_size"] = sp.vocab_size()
    with open(os.path.join(OUT, "sft.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(os.path.join(OUT, "tokenizer_info.json"), "w") as f:
        json.dump(info, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"{len(rows)} SFT examples, {sum(len(v) for v in plain.values())} plain strings; info {info}")


def _varint(buf, i):
    v, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


def _put_varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def mark_unused(path, count=12):
    """Marks `count` two-character merged pieces UNUSED (type 5), so merges pass through them
    and the encoder must split them back. Rewrites the protobuf by hand (no protobuf package)."""
    with open(path, "rb") as f:
        buf = f.read()
    out, i, marked = bytearray(), 0, 0
    while i < len(buf):
        key, j = _varint(buf, i)
        assert key & 7 == 2, "ModelProto's top-level fields are length-delimited"
        n, k = _varint(buf, j)
        body = buf[k : k + n]
        if key >> 3 == 1 and marked < count:
            fields, p = {}, 0
            while p < len(body):
                fk, q = _varint(body, p)
                if fk & 7 == 2:
                    ln, q = _varint(body, q)
                    fields[fk >> 3] = (fk, body[q : q + ln])
                    p = q + ln
                elif fk & 7 == 5:
                    fields[fk >> 3] = (fk, body[q : q + 4])
                    p = q + 4
                else:
                    v, p = _varint(body, q)
                    fields[fk >> 3] = (fk, v)
            kind = fields.get(3, (0, 1))[1]
            text = fields[1][1].decode()
            if kind == 1 and len(text) == 2 and "\u2581" not in text:
                body = (_put_varint(0x0A) + _put_varint(len(fields[1][1])) + fields[1][1]
                        + bytes([0x15]) + fields[2][1] + bytes([0x18, 5]))
                marked += 1
        out += _put_varint(key) + _put_varint(len(body)) + body
        i = k + n
    with open(path, "wb") as f:
        f.write(bytes(out))


if __name__ == "__main__":
    sys.exit(main())
