//! Slurm's compact host lists (`SLURM_JOB_NODELIST`): `dcu[01-04,07],login5` names
//! `dcu01 … dcu04, dcu07, login5`. Parsed here, bounded, without `scontrol`.

/// The longest host list parsed, in bytes.
pub const MAX_LIST: usize = 64 * 1024;

/// One piece of a host expression: literal text or a bracketed set of numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Text(String),
    /// `(first, last, width)`: numbers `first..=last`, zero padded to `width` digits.
    Ranges(Vec<(u64, u64, usize)>),
}

/// A parsed host list: one expression per comma-separated item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostList(Vec<Vec<Segment>>);

impl HostList {
    /// Parse `text`; an error says what is wrong and where.
    pub fn parse(text: &str) -> Result<HostList, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("it is empty".into());
        }
        if text.len() > MAX_LIST {
            return Err(format!(
                "it is {} bytes long (at most {MAX_LIST})",
                text.len()
            ));
        }
        let mut items = Vec::new();
        let mut item: Vec<Segment> = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                ',' => {
                    if !literal.is_empty() {
                        item.push(Segment::Text(std::mem::take(&mut literal)));
                    }
                    if item.is_empty() {
                        return Err(format!("an empty host name at byte {at}"));
                    }
                    items.push(std::mem::take(&mut item));
                }
                '[' => {
                    if !literal.is_empty() {
                        item.push(Segment::Text(std::mem::take(&mut literal)));
                    }
                    let mut inner = String::new();
                    loop {
                        match chars.next() {
                            Some((_, ']')) => break,
                            Some((_, c)) => inner.push(c),
                            None => return Err(format!("the `[` at byte {at} is never closed")),
                        }
                    }
                    item.push(Segment::Ranges(
                        ranges(&inner).map_err(|e| format!("in `[{inner}]` at byte {at}: {e}"))?,
                    ));
                }
                ']' => return Err(format!("a `]` at byte {at} without its `[`")),
                c if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') => literal.push(c),
                c => return Err(format!("{c:?} at byte {at} cannot be part of a host name")),
            }
        }
        if !literal.is_empty() {
            item.push(Segment::Text(literal));
        }
        if item.is_empty() {
            return Err("it ends with an empty host name".into());
        }
        items.push(item);
        Ok(HostList(items))
    }

    /// The first host named.
    pub fn first(&self) -> String {
        let mut out = String::new();
        for seg in self.0.first().into_iter().flatten() {
            match seg {
                Segment::Text(t) => out.push_str(t),
                Segment::Ranges(r) => {
                    if let Some((lo, _, w)) = r.first() {
                        out.push_str(&format!("{lo:0w$}"));
                    }
                }
            }
        }
        out
    }

    /// Every host, in order; an error past `limit` hosts.
    pub fn expand(&self, limit: usize) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for item in &self.0 {
            let mut hosts = vec![String::new()];
            for seg in item {
                hosts = match seg {
                    Segment::Text(t) => hosts.into_iter().map(|h| h + t).collect(),
                    Segment::Ranges(rs) => {
                        let mut next = Vec::new();
                        for h in &hosts {
                            for &(lo, hi, w) in rs {
                                for n in lo..=hi {
                                    if out.len() + next.len() >= limit {
                                        return Err(format!("it names more than {limit} hosts"));
                                    }
                                    next.push(format!("{h}{n:0w$}"));
                                }
                            }
                        }
                        next
                    }
                };
            }
            if out.len() + hosts.len() > limit {
                return Err(format!("it names more than {limit} hosts"));
            }
            out.extend(hosts);
        }
        Ok(out)
    }
}

/// `01-03,07` → `[(1, 3, 2), (7, 7, 2)]`.
fn ranges(inner: &str) -> Result<Vec<(u64, u64, usize)>, String> {
    let mut out = Vec::new();
    for part in inner.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let num = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(format!("`{s}` is not a number of at most 18 digits"));
            }
            s.parse::<u64>().map_err(|e| format!("`{s}`: {e}"))
        };
        let (a, b) = (num(lo)?, num(hi)?);
        if a > b {
            return Err(format!("the range `{part}` runs backwards"));
        }
        out.push((a, b, lo.len()));
    }
    Ok(out)
}

/// The first host of `list`, the list itself checked whole.
pub fn first_host(list: &str) -> Result<String, String> {
    HostList::parse(list).map(|l| l.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(list: &str) -> Vec<String> {
        HostList::parse(list).unwrap().expand(1000).unwrap()
    }

    #[test]
    fn compact_lists_expand_with_their_zero_padding() {
        assert_eq!(all("a[01-03,07],b5"), ["a01", "a02", "a03", "a07", "b5"]);
        assert_eq!(
            all("dcu[098-101]"),
            ["dcu098", "dcu099", "dcu100", "dcu101"]
        );
        assert_eq!(all("n[8-10]"), ["n8", "n9", "n10"]);
        assert_eq!(all("node1"), ["node1"]);
        assert_eq!(all(" x-1.y_z "), ["x-1.y_z"]);
        assert_eq!(all("r[1-2]n[01-02]"), ["r1n01", "r1n02", "r2n01", "r2n02"]);
        assert_eq!(all("a[1],b[2-3]-ib"), ["a1", "b2-ib", "b3-ib"]);
        assert_eq!(first_host("a[01-03,07],b5").unwrap(), "a01");
        assert_eq!(first_host("b5,a[01-03]").unwrap(), "b5");
        assert_eq!(
            first_host("rack[3-4]-dcu[007-009]").unwrap(),
            "rack3-dcu007"
        );
    }

    #[test]
    fn malformed_lists_are_errors_saying_why() {
        for (list, needle) in [
            ("", "empty"),
            ("a[01-03", "never closed"),
            ("a]", "without its `[`"),
            ("a[3-1]", "backwards"),
            ("a[x]", "not a number"),
            ("a[1-]", "not a number"),
            ("a,,b", "empty host name"),
            ("a,", "empty host name"),
            ("a b", "cannot be part of a host name"),
            ("a[99999999999999999999]", "at most 18 digits"),
        ] {
            let e = HostList::parse(list).unwrap_err();
            assert!(e.contains(needle), "{list:?}: {e}");
        }
        let long = "a".repeat(MAX_LIST + 1);
        assert!(HostList::parse(&long).unwrap_err().contains("bytes long"));
        // A huge range is parsed (only its first host is needed), never expanded past a limit.
        let huge = HostList::parse("n[0-999999999999]").unwrap();
        assert_eq!(huge.first(), "n0");
        assert!(huge.expand(100).unwrap_err().contains("more than 100"));
    }
}
