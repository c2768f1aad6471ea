//! `tokenizer_config.json`'s `chat_template`, rendered with minijinja as transformers renders
//! it with jinja2: `trim_blocks` and `lstrip_blocks` on, the loop controls, Python's string
//! methods (`.strip()`, `.startswith()`, …), `raise_exception(msg)` raising, and the context
//! `messages`, `add_generation_prompt` and the special tokens (`bos_token`, `eos_token`,
//! `pad_token`, `unk_token`) that the config names.

use super::record::Message;
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use std::collections::BTreeMap;

/// The name the template is stored under.
const NAME: &str = "chat_template";

/// A compiled chat template with its special tokens.
pub struct ChatTemplate {
    env: Environment<'static>,
    tokens: BTreeMap<&'static str, String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

/// One message as the template sees it.
#[derive(Serialize)]
struct Msg<'a> {
    role: &'static str,
    content: &'a str,
}

impl ChatTemplate {
    /// Compile `source` with the special tokens `tokens` (name → text; the names the template
    /// may use are `bos_token`, `eos_token`, `pad_token`, `unk_token`). Errors are minijinja's
    /// syntax errors, with the template's line.
    pub fn new(source: &str, tokens: BTreeMap<&'static str, String>) -> Result<Self, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| describe(&e))?;
        Ok(Self { env, tokens })
    }

    /// The text of `messages`, with the assistant's prompt appended when
    /// `add_generation_prompt` (and the template supports it).
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, String> {
        let msgs: Vec<Msg<'_>> = messages
            .iter()
            .map(|m| Msg {
                role: m.role.as_str(),
                content: &m.content,
            })
            .collect();
        let mut ctx: BTreeMap<&str, minijinja::Value> = self
            .tokens
            .iter()
            .map(|(k, v)| (*k, minijinja::Value::from(v.as_str())))
            .collect();
        ctx.insert("messages", minijinja::Value::from_serialize(&msgs));
        ctx.insert(
            "add_generation_prompt",
            minijinja::Value::from(add_generation_prompt),
        );
        let t = self.env.get_template(NAME).map_err(|e| describe(&e))?;
        t.render(ctx).map_err(|e| describe(&e))
    }
}

/// `raise_exception(msg)`: the template's own error, as transformers raises it.
fn raise_exception(msg: String) -> Result<String, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised: {msg}"),
    ))
}

/// minijinja's error with its chain of causes, on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        s.push_str(&format!(": {c}"));
        src = c.source();
    }
    s
}
