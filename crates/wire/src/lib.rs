//! The little-endian encoding of every cpkv snapshot (the allocator's, the
//! prefix tree's and the policy state inside it): a growing writer and a
//! bounds-checked reader whose every failure is a `WireError`, never a
//! panic, so a truncated or corrupted snapshot is refused, not trusted.

use std::fmt;

/// Appends little-endian values to a byte buffer.
#[derive(Debug, Default)]
pub struct Writer(Vec<u8>);

impl Writer {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
    pub fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
    /// A u64-length-prefixed run of words.
    pub fn u64s(&mut self, values: &[u64]) {
        self.u64(values.len() as u64);
        values.iter().for_each(|v| self.u64(*v));
    }
    /// A u32-length-prefixed UTF-8 string; panics past 4 GiB, a length no
    /// name in a snapshot comes near.
    pub fn str(&mut self, s: &str) {
        self.u32(u32::try_from(s.len()).expect("names are short"));
        self.raw(s.as_bytes());
    }
}

/// Why bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// `wanted` bytes were asked for at offset `at`, with only `left` left.
    Truncated {
        wanted: usize,
        at: usize,
        left: usize,
    },
    /// A count of `count` items of at least `item_bytes` each cannot fit in
    /// the `left` bytes that follow it.
    CountTooLarge {
        count: u64,
        item_bytes: usize,
        left: usize,
    },
    /// A string at offset `at` is not UTF-8.
    NotUtf8 { at: usize },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { wanted, at, left } => write!(
                f,
                "truncated: wanted {wanted} bytes at offset {at}, {left} left"
            ),
            Self::CountTooLarge {
                count,
                item_bytes,
                left,
            } => write!(
                f,
                "count {count} of {item_bytes}-byte items exceeds the {left} bytes left"
            ),
            Self::NotUtf8 { at } => write!(f, "the string at offset {at} is not UTF-8"),
        }
    }
}

impl std::error::Error for WireError {}

/// Decoders that report errors as messages take a `WireError` with `?`.
impl From<WireError> for String {
    fn from(e: WireError) -> Self {
        e.to_string()
    }
}

/// Reads little-endian values from a byte slice, checking every bound.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0 }
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.at
    }
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.remaining() {
            return Err(WireError::Truncated {
                wanted: n,
                at: self.at,
                left: self.remaining(),
            });
        }
        let out = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.bytes(N)?.try_into().expect("exactly N bytes"))
    }
    /// A u64 count of items at least `item_bytes` long each, checked against
    /// what is left, so a corrupt count cannot ask for a huge allocation.
    pub fn len(&mut self, item_bytes: usize) -> Result<usize, WireError> {
        let count = self.u64()?;
        self.fitting(count, item_bytes)
    }
    /// As `len`, for a u32 count.
    pub fn len_u32(&mut self, item_bytes: usize) -> Result<usize, WireError> {
        let count = self.u32()?;
        self.fitting(count.into(), item_bytes)
    }
    fn fitting(&self, count: u64, item_bytes: usize) -> Result<usize, WireError> {
        match usize::try_from(count) {
            Ok(n) if n.saturating_mul(item_bytes) <= self.remaining() => Ok(n),
            _ => Err(WireError::CountTooLarge {
                count,
                item_bytes,
                left: self.remaining(),
            }),
        }
    }
    /// A u64-length-prefixed run of words (what `Writer::u64s` writes).
    pub fn u64s(&mut self) -> Result<Vec<u64>, WireError> {
        let n = self.len(8)?;
        (0..n).map(|_| self.u64()).collect()
    }
    /// A u32-length-prefixed UTF-8 string (what `Writer::str` writes).
    pub fn str(&mut self) -> Result<&'a str, WireError> {
        let n = self.len_u32(1)?;
        let at = self.at;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| WireError::NotUtf8 { at })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = Writer::default();
        w.u8(7);
        w.u32(0xdead_beef);
        w.u64(u64::MAX - 1);
        w.u64s(&[1, 2, 3]);
        w.str("kv");
        w.into_bytes()
    }

    #[test]
    fn what_the_writer_writes_the_reader_reads_back() {
        let data = sample();
        assert_eq!(data.len(), 1 + 4 + 8 + (8 + 3 * 8) + (4 + 2));
        let mut r = Reader::new(&data);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.u32(), Ok(0xdead_beef));
        assert_eq!(r.u64(), Ok(u64::MAX - 1));
        assert_eq!(r.u64s(), Ok(vec![1, 2, 3]));
        assert_eq!(r.str(), Ok("kv"));
        assert!(r.is_empty());
    }

    #[test]
    fn the_layout_is_little_endian_with_length_prefixes() {
        let mut w = Writer::default();
        w.u32(0x0102_0304);
        w.str("ab");
        assert_eq!(w.bytes(), [4, 3, 2, 1, 2, 0, 0, 0, b'a', b'b']);
    }

    /// Every prefix of a valid encoding fails at the first read that runs
    /// past its end, naming the offset, and never panics.
    #[test]
    fn every_truncation_is_an_error_naming_where() {
        let data = sample();
        for cut in 0..data.len() {
            let mut r = Reader::new(&data[..cut]);
            let read = (|| -> Result<(), WireError> {
                r.u8()?;
                r.u32()?;
                r.u64()?;
                r.u64s()?;
                r.str()?;
                Ok(())
            })();
            match read {
                Err(WireError::Truncated { wanted, at, left }) => {
                    assert!(wanted > left && at + left == cut, "cut {cut}")
                }
                Err(WireError::CountTooLarge { left, .. }) => assert!(left < data.len()),
                other => panic!("cut {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_read_past_the_end_names_its_size_offset_and_what_is_left() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u8(), Ok(1));
        let err = r.u64().unwrap_err();
        assert_eq!(
            err,
            WireError::Truncated {
                wanted: 8,
                at: 1,
                left: 2
            }
        );
        assert_eq!(
            err.to_string(),
            "truncated: wanted 8 bytes at offset 1, 2 left"
        );
        // A failed read consumes nothing.
        assert_eq!(r.remaining(), 2);
        assert_eq!(r.bytes(2), Ok(&[2, 3][..]));
    }

    #[test]
    fn a_count_larger_than_the_bytes_left_is_refused_before_any_allocation() {
        let mut w = Writer::default();
        w.u64(u64::MAX);
        w.u64(5);
        let mut r = Reader::new(w.bytes());
        assert_eq!(
            r.len(8),
            Err(WireError::CountTooLarge {
                count: u64::MAX,
                item_bytes: 8,
                left: 8
            })
        );
        // A count that fits exactly is accepted; one more item is not.
        let mut w = Writer::default();
        w.u32(2);
        w.raw(&[0; 8]);
        assert_eq!(Reader::new(w.bytes()).len_u32(4), Ok(2));
        assert!(Reader::new(w.bytes()).len_u32(5).is_err());
        let mut w = Writer::default();
        w.u64s(&[1, 2]);
        let mut short = w.into_bytes();
        short.pop();
        let err = Reader::new(&short).u64s().unwrap_err();
        assert!(
            matches!(err, WireError::CountTooLarge { count: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_string_that_is_not_utf8_names_its_offset() {
        let mut w = Writer::default();
        w.u8(0);
        w.u32(2);
        w.raw(&[0xff, 0xfe]);
        let mut r = Reader::new(w.bytes());
        r.u8().unwrap();
        assert_eq!(r.str(), Err(WireError::NotUtf8 { at: 5 }));
    }

    #[test]
    fn a_message_decoder_takes_wire_errors_with_a_question_mark() {
        fn decode(data: &[u8]) -> Result<u64, String> {
            Ok(Reader::new(data).u64()?)
        }
        assert_eq!(
            decode(&[0; 3]),
            Err("truncated: wanted 8 bytes at offset 0, 3 left".to_string())
        );
    }
}
