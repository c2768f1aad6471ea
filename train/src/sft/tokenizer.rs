//! `--tokenizer DIR`: `tokenizer.json` through Hugging Face's `tokenizers` (the library
//! transformers' fast tokenizers are), and `tokenizer_config.json`'s chat template and special
//! tokens.

use super::error::{Result, SftError};
use super::jsonl::sha256_files;
use super::record::Message;
use super::template::ChatTemplate;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most a tokenizer file may weigh (a 256k-vocabulary tokenizer.json is about 20 MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A model's tokenizer and chat template.
pub struct SftTokenizer {
    /// The directory.
    pub dir: PathBuf,
    tok: tokenizers::Tokenizer,
    template: ChatTemplate,
    /// The id padding positions take: the config's `pad_token`, or 0.
    pub pad_id: u32,
    /// SHA-256 of tokenizer.json and tokenizer_config.json (what resuming compares).
    pub fingerprint: String,
}

impl std::fmt::Debug for SftTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftTokenizer")
            .field("dir", &self.dir)
            .field("pad_id", &self.pad_id)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// The text of a special-token entry: a string, or an AddedToken object's `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl SftTokenizer {
    /// Load `dir`/tokenizer.json and `dir`/tokenizer_config.json.
    pub fn load(dir: &Path) -> Result<Self> {
        let tj = dir.join("tokenizer.json");
        let cj = dir.join("tokenizer_config.json");
        for p in [&tj, &cj] {
            if !p.is_file() {
                return Err(SftError::file(
                    p,
                    "not found: --tokenizer DIR must hold the model's tokenizer.json and \
                     tokenizer_config.json (as saved by transformers' save_pretrained)",
                ));
            }
        }
        let fingerprint = sha256_files(&[&tj, &cj], MAX_TOKENIZER_BYTES)?;
        let bytes = read(&tj)?;
        let tok = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            SftError::file(
                &tj,
                format!(
                    "is not a tokenizer the `tokenizers` library can load ({e}); \
                     save it again with transformers' save_pretrained"
                ),
            )
        })?;
        let cfg: Value = serde_json::from_slice(&read(&cj)?).map_err(|e| SftError::Line {
            path: cj.clone(),
            line: e.line() as u64,
            col: Some(e.column() as u64),
            msg: format!("malformed JSON ({e})"),
        })?;
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => named_default(list).ok_or_else(|| {
                SftError::file(
                    &cj,
                    "`chat_template` is a list without an entry named `default`",
                )
            })?,
            _ => {
                let jinja = dir.join("chat_template.jinja");
                if jinja.is_file() {
                    String::from_utf8(read(&jinja)?)
                        .map_err(|_| SftError::file(&jinja, "is not UTF-8"))?
                } else {
                    return Err(SftError::file(
                        &cj,
                        "has no `chat_template` string (and there is no chat_template.jinja \
                         beside it): SFT data is rendered with the model's chat template; use \
                         the tokenizer of an instruction-tuned model or add one",
                    ));
                }
            }
        };
        let mut tokens = BTreeMap::new();
        for name in ["bos_token", "eos_token", "pad_token", "unk_token"] {
            if let Some(t) = cfg.get(name).and_then(token_text) {
                tokens.insert(name, t);
            }
        }
        let pad_id = tokens
            .get("pad_token")
            .and_then(|t| tok.token_to_id(t))
            .unwrap_or(0);
        let template = ChatTemplate::new(&source, tokens)
            .map_err(|m| SftError::file(&cj, format!("its chat_template does not compile: {m}")))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tok,
            template,
            pad_id,
            fingerprint,
        })
    }

    /// The ids of `text`, without added special tokens (as apply_chat_template encodes; special
    /// tokens written in the text are still recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tok
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("the tokenizer failed: {e}"))
    }

    /// The chat template's text of `messages`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        self.template.render(messages, add_generation_prompt)
    }

    /// The text of one id (for previews), `None` if the id is unknown.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tok.id_to_token(id)
    }

    /// Decode `ids` to text, special tokens included (for previews).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tok.decode(ids, false).unwrap_or_default()
    }

    /// The tokenizer's vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tok.get_vocab_size(true)
    }
}

/// The `default` entry of a list of named templates (`[{"name", "template"}, …]`).
fn named_default(list: &[Value]) -> Option<String> {
    list.iter().find_map(|e| {
        (e.get("name")?.as_str()? == "default")
            .then(|| e.get("template")?.as_str().map(str::to_string))
            .flatten()
    })
}

/// A tokenizer file, whole and bounded.
fn read(p: &Path) -> Result<Vec<u8>> {
    crate::error::read_regular(p, MAX_TOKENIZER_BYTES).map_err(|e| match e {
        crate::error::TrainError::Io { source, .. } => SftError::io(p)(source),
        other => SftError::file(p, other.to_string()),
    })
}
