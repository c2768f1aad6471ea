//! [`Settings`]: the run configuration the ranks compare at the rendezvous.

use super::error::RendezvousError;

/// The largest encoded [`Settings`] accepted, in bytes.
pub const MAX_SETTINGS: usize = 16 * 1024;

/// The run configuration every rank must share (learning rate, sequence length, a fingerprint
/// of the initial weights, …), as `(name, value)` pairs in a fixed order. Rank 0 compares each
/// peer's with its own and refuses the first that differs, naming it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings(pub Vec<(String, String)>);

impl Settings {
    pub(crate) fn encode(&self) -> Result<Vec<u8>, RendezvousError> {
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            for s in [k, v] {
                let len = u16::try_from(s.len()).map_err(|_| self.too_large())?;
                out.extend(len.to_be_bytes());
                out.extend(s.as_bytes());
            }
        }
        if out.len() > MAX_SETTINGS {
            return Err(self.too_large());
        }
        Ok(out)
    }

    fn too_large(&self) -> RendezvousError {
        RendezvousError::Mismatch {
            detail: format!(
                "the run settings ({} entries) encode to more than {MAX_SETTINGS} bytes",
                self.0.len()
            ),
        }
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Settings> {
        let mut out = Vec::new();
        let mut rest = bytes;
        let mut take = || -> Option<String> {
            let (len, tail) = rest.split_first_chunk::<2>()?;
            let len = u16::from_be_bytes(*len) as usize;
            let s = String::from_utf8(tail.get(..len)?.to_vec()).ok()?;
            rest = &tail[len..];
            Some(s)
        };
        while let Some(k) = take() {
            out.push((k, take()?));
        }
        rest.is_empty().then_some(Settings(out))
    }

    /// The first setting in which `peer` differs from `self`, as a sentence.
    pub(crate) fn differs(&self, peer: &Settings, rank: usize) -> Option<String> {
        let find = |s: &Settings, k: &str| s.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        for (k, mine) in &self.0 {
            match find(peer, k) {
                Some(theirs) if &theirs == mine => {}
                Some(theirs) => {
                    return Some(format!(
                        "{k} differs: rank 0 has {mine}, rank {rank} has {theirs}"
                    ))
                }
                None => return Some(format!("{k}: rank 0 has {mine}, rank {rank} has none")),
            }
        }
        peer.0
            .iter()
            .find(|(k, _)| find(self, k).is_none())
            .map(|(k, v)| format!("{k}: rank {rank} has {v}, rank 0 has none"))
    }
}
