//! Little-endian encoding for snapshots: a growing writer and a bounds-checked
//! reader whose every failure is an error message, never a panic.

#[derive(Debug, Default)]
pub(crate) struct Writer(Vec<u8>);

impl Writer {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
    /// A length-prefixed run of words.
    pub(crate) fn u64s(&mut self, values: &[u64]) {
        self.u64(values.len() as u64);
        values.iter().for_each(|v| self.u64(*v));
    }
    /// A u32-length-prefixed UTF-8 string.
    pub(crate) fn str(&mut self, s: &str) {
        self.u32(u32::try_from(s.len()).expect("names are short"));
        self.raw(s.as_bytes());
    }
}

pub(crate) struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data, at: 0 }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.data.len() - self.at
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.remaining() == 0
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: wanted {n} bytes at offset {}, {} left",
                self.at,
                self.remaining()
            ));
        }
        let out = &self.data[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A u64 count of items at least `item_bytes` long each, checked against
    /// what is left, so a corrupt count cannot ask for a huge allocation.
    pub(crate) fn len(&mut self, item_bytes: usize) -> Result<usize, String> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(item_bytes) <= self.remaining() => Ok(n),
            _ => Err(format!(
                "count {n} exceeds the {} bytes left",
                self.remaining()
            )),
        }
    }
    pub(crate) fn u64s(&mut self) -> Result<Vec<u64>, String> {
        let n = self.len(8)?;
        (0..n).map(|_| self.u64()).collect()
    }
    pub(crate) fn str(&mut self) -> Result<&'a str, String> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.bytes(n)?).map_err(|e| format!("bad UTF-8: {e}"))
    }
}
