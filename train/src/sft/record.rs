//! One JSONL line as a conversation: `{"messages": [{"role", "content"}, …]}` or alpaca's
//! `{"instruction", "input"?, "output", "system"?}`.

use super::error::{Result, SftError};
use serde_json::{Map, Value};
use std::path::Path;

/// Who speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The system prompt.
    System,
    /// The user.
    User,
    /// The model: its tokens are the trained ones.
    Assistant,
}

impl Role {
    /// The role as templates see it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// What is said.
    pub content: String,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
        }
    }
}

/// What a line holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// An empty (or all-whitespace) line: skipped.
    Empty,
    /// A conversation.
    Messages(Vec<Message>),
}

/// Parse line `line` of `path` (its text `text`).
pub fn parse(path: &Path, line: u64, text: &str) -> Result<Record> {
    if text.trim().is_empty() {
        return Ok(Record::Empty);
    }
    let value: Value = serde_json::from_str(text).map_err(|e| SftError::Line {
        path: path.to_path_buf(),
        line,
        col: Some(e.column() as u64),
        msg: format!(
            "malformed JSON ({}); each line must be one JSON object: \
             {{\"messages\": [...]}} or {{\"instruction\": ..., \"output\": ...}}",
            json_message(&e)
        ),
    })?;
    let err = |msg: String| SftError::line(path, line, msg);
    let Value::Object(obj) = value else {
        return Err(err(format!(
            "is a JSON {}, not an object; each line must be {{\"messages\": [...]}} or \
             alpaca's {{\"instruction\": ..., \"input\": ..., \"output\": ...}}",
            kind(&value)
        )));
    };
    let has_alpaca = obj.contains_key("instruction") || obj.contains_key("output");
    match (obj.get("messages"), has_alpaca) {
        (Some(_), true) => Err(err(
            "has both `messages` and alpaca's `instruction`/`output`: keep one format per line"
                .into(),
        )),
        (Some(m), false) => messages(m).map(Record::Messages).map_err(err),
        (None, true) => alpaca(&obj).map(Record::Messages).map_err(err),
        (None, false) => Err(err(format!(
            "is neither a conversation nor an alpaca record: it has {} but needs `messages` \
             (a list of {{\"role\", \"content\"}}) or `instruction` and `output`",
            keys(&obj)
        ))),
    }
}

/// serde_json's message without its `at line L column C` (the line is the file's, given apart).
pub fn json_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" at line ") {
        Some((m, _)) => m.to_string(),
        None => s,
    }
}

/// The JSON type of `v`, as an error says it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `keys a, b` or `no keys`.
fn keys(obj: &Map<String, Value>) -> String {
    if obj.is_empty() {
        return "no keys".into();
    }
    let names: Vec<String> = obj.keys().take(8).map(|k| format!("`{k}`")).collect();
    format!("keys {}", names.join(", "))
}

/// A string field: `Ok(None)` when absent or null.
fn string_field<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    what: &str,
) -> Result<Option<&'a str>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(format!("{what}`{key}` is a JSON {}, not a string", kind(v))),
    }
}

/// `[system?] + [user: instruction + ("\n" + input if input is non-empty)] + [assistant: output]`
/// (an empty instruction with an input: the input alone).
fn alpaca(obj: &Map<String, Value>) -> Result<Vec<Message>, String> {
    let need = |key: &str| {
        string_field(obj, key, "")?.ok_or_else(|| {
            format!(
                "alpaca record without `{key}` (needs `instruction` and `output` strings; \
                 `input` and `system` are optional)"
            )
        })
    };
    let instruction = need("instruction")?;
    let output = need("output")?;
    let input = string_field(obj, "input", "")?.unwrap_or("");
    let mut out = Vec::with_capacity(3);
    if let Some(system) = string_field(obj, "system", "")? {
        if !system.is_empty() {
            out.push(Message::new(Role::System, system));
        }
    }
    // The non-empty ones of instruction and input, joined by "\n" (LLaMA-Factory's alpaca
    // converter: an empty instruction leaves the input alone).
    let user = match (instruction.is_empty(), input.is_empty()) {
        (_, true) => instruction.to_string(),
        (true, false) => input.to_string(),
        (false, false) => format!("{instruction}\n{input}"),
    };
    out.push(Message::new(Role::User, user));
    out.push(Message::new(Role::Assistant, output));
    Ok(out)
}

/// `[{"role": "system"|"user"|"assistant", "content": "…"}, …]`.
fn messages(v: &Value) -> Result<Vec<Message>, String> {
    let Value::Array(items) = v else {
        return Err(format!(
            "`messages` is a JSON {}, not a list of {{\"role\", \"content\"}} objects",
            kind(v)
        ));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(m) = item else {
            return Err(format!(
                "messages[{i}] is a JSON {}, not an object {{\"role\", \"content\"}}",
                kind(item)
            ));
        };
        let at = format!("messages[{i}].");
        let role = string_field(m, "role", &at)?
            .ok_or_else(|| format!("messages[{i}] has no `role` (system, user or assistant)"))?;
        let role = match role {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(format!(
                    "messages[{i}] has the unknown role `{other}`; roles are system, user and \
                     assistant"
                ))
            }
        };
        let content = string_field(m, "content", &at)?
            .ok_or_else(|| format!("messages[{i}] ({}) has no `content` string", role.as_str()))?;
        out.push(Message::new(role, content));
    }
    Ok(out)
}
