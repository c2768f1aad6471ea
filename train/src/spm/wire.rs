//! A bounded reader of protobuf's wire format: exactly what [`super::model`] needs to read
//! SentencePiece's `ModelProto` (varints, fixed 32/64-bit words, length-delimited fields).
//!
//! Every read checks the bytes left, so a truncated or corrupt buffer is a [`WireError`]
//! naming the byte offset, never a panic or an out-of-bounds read. Groups (wire types 3 and 4,
//! deprecated and never written by SentencePiece) are refused.

/// What is wrong with the bytes at `at` (an offset in the message being read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ends inside a field.
    #[error("truncated at byte {at}: {what} runs past the end")]
    Truncated {
        /// Offset where the cut field starts.
        at: usize,
        /// What was being read.
        what: &'static str,
    },
    /// A varint longer than 10 bytes.
    #[error("corrupt varint at byte {at} (longer than 10 bytes)")]
    LongVarint {
        /// Offset of the varint.
        at: usize,
    },
    /// A field key with a wire type protobuf does not define, or a group.
    #[error("unsupported wire type {wire_type} at byte {at}")]
    WireType {
        /// Offset of the key.
        at: usize,
        /// The wire type (low 3 bits of the key).
        wire_type: u8,
    },
    /// A field key with number 0 (never valid).
    #[error("field number 0 at byte {at}")]
    FieldZero {
        /// Offset of the key.
        at: usize,
    },
}

/// One field's value, as the wire carries it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: strings, bytes and embedded messages.
    Bytes(&'a [u8]),
    /// Wire type 5 (a `float` is `f32::from_bits` of it).
    Fixed32(u32),
}

/// One field: its number, its value and the offset of its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Field<'a> {
    pub(crate) number: u32,
    pub(crate) value: Value<'a>,
    pub(crate) at: usize,
}

/// Reads the fields of one message in order.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` in the file, so errors name file offsets.
    base: usize,
}

impl<'a> Reader<'a> {
    /// A reader of the message `buf`, which starts at byte `base` of the file.
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    fn varint(&mut self, what: &'static str) -> Result<u64, WireError> {
        let at = self.base + self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(WireError::Truncated { at, what });
            };
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(WireError::LongVarint { at })
    }

    fn take(&mut self, n: usize, at: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len());
        let Some(end) = end else {
            return Err(WireError::Truncated { at, what });
        };
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    /// The offset in the file of the next byte to read.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    /// The next field, or `None` at the end of the message.
    pub(crate) fn next_field(&mut self) -> Result<Option<Field<'a>>, WireError> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let at = self.offset();
        let key = self.varint("a field key")?;
        let wire_type = (key & 7) as u8;
        let number = key >> 3;
        if number == 0 {
            return Err(WireError::FieldZero { at });
        }
        // Field numbers above 2^29 - 1 are invalid; treat them like any unknown field number
        // (skipped by the caller) but keep them representable.
        let number = u32::try_from(number).unwrap_or(u32::MAX);
        let value = match wire_type {
            0 => Value::Varint(self.varint("a varint field")?),
            1 => {
                let b = self.take(8, at, "a 64-bit field")?;
                let mut w = [0u8; 8];
                w.copy_from_slice(b);
                Value::Fixed64(u64::from_le_bytes(w))
            }
            2 => {
                let len = self.varint("a length prefix")?;
                let len = usize::try_from(len).unwrap_or(usize::MAX);
                Value::Bytes(self.take(len, at, "a length-delimited field")?)
            }
            5 => {
                let b = self.take(4, at, "a 32-bit field")?;
                let mut w = [0u8; 4];
                w.copy_from_slice(b);
                Value::Fixed32(u32::from_le_bytes(w))
            }
            _ => return Err(WireError::WireType { at, wire_type }),
        };
        Ok(Some(Field { number, value, at }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(buf: &[u8]) -> Result<Vec<Field<'_>>, WireError> {
        let mut r = Reader::new(buf, 0);
        let mut out = Vec::new();
        while let Some(f) = r.next_field()? {
            out.push(f);
        }
        Ok(out)
    }

    #[test]
    fn reads_each_wire_type() {
        // field 1 varint 300; field 2 bytes "hi"; field 3 fixed32 1.5f; field 4 fixed64 7.
        let mut buf = vec![0x08, 0xac, 0x02, 0x12, 0x02, b'h', b'i', 0x1d];
        buf.extend_from_slice(&1.5f32.to_bits().to_le_bytes());
        buf.push(0x21);
        buf.extend_from_slice(&7u64.to_le_bytes());
        let f = fields(&buf).unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!((f[0].number, f[0].value), (1, Value::Varint(300)));
        assert_eq!((f[1].number, f[1].value), (2, Value::Bytes(b"hi")));
        assert_eq!(f[2].value, Value::Fixed32(1.5f32.to_bits()));
        assert_eq!(f[3].value, Value::Fixed64(7));
        assert_eq!(f[3].at, 12);
    }

    #[test]
    fn truncation_and_corruption_are_errors() {
        assert_eq!(
            fields(&[0x12, 0x05, b'a']),
            Err(WireError::Truncated {
                at: 0,
                what: "a length-delimited field"
            })
        );
        assert_eq!(
            fields(&[0x08, 0x80]),
            Err(WireError::Truncated {
                at: 1,
                what: "a varint field"
            })
        );
        assert_eq!(
            fields(&[0x1d, 1, 2]).unwrap_err(),
            WireError::Truncated {
                at: 0,
                what: "a 32-bit field"
            }
        );
        assert_eq!(
            fields(&[0x08; 1]).unwrap_err(),
            WireError::Truncated {
                at: 1,
                what: "a varint field"
            }
        );
        assert_eq!(
            fields(&[0x0b]),
            Err(WireError::WireType {
                at: 0,
                wire_type: 3
            })
        );
        assert_eq!(fields(&[0x00, 0x00]), Err(WireError::FieldZero { at: 0 }));
        assert_eq!(
            fields(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(WireError::LongVarint { at: 1 })
        );
        // A length prefix near u64::MAX must not overflow.
        let huge = [
            0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(matches!(fields(&huge), Err(WireError::Truncated { .. })));
    }
}
