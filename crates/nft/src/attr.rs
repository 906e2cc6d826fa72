//! Netlink attribute (TLV) writing and reading: 4-byte header (length, type), payload
//! padded to 4 bytes, nesting marked with `NLA_F_NESTED`.

use crate::error::NftError;
use crate::sys::{NLA_F_NESTED, NLA_TYPE_MASK};

/// Rounds `n` up to the netlink alignment (4 bytes).
pub(crate) const fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends attributes to a message buffer.
pub(crate) struct AttrWriter<'a> {
    buf: &'a mut Vec<u8>,
}

impl<'a> AttrWriter<'a> {
    pub(crate) fn new(buf: &'a mut Vec<u8>) -> Self {
        AttrWriter { buf }
    }

    pub(crate) fn bytes(&mut self, ty: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    /// A NUL-terminated string, as the kernel's `NLA_STRING` policies expect.
    pub(crate) fn string(&mut self, ty: u16, s: &str) {
        let len = 4 + s.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    /// nf_tables numbers travel in network byte order.
    pub(crate) fn be32(&mut self, ty: u16, v: u32) {
        self.bytes(ty, &v.to_be_bytes());
    }

    /// Writes a nested attribute whose content `f` appends.
    pub(crate) fn nested(&mut self, ty: u16, f: impl FnOnce(&mut AttrWriter<'_>)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        f(&mut AttrWriter::new(self.buf));
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Appends bytes that are already complete, aligned attributes.
    pub(crate) fn extend_raw(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        let n = align(self.buf.len()) - self.buf.len();
        self.buf.extend_from_slice(&[0u8; 3][..n]);
    }
}

/// One attribute read from a buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attr<'a> {
    /// Type without the nested/byte-order flags.
    pub ty: u16,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub(crate) fn be32(&self) -> Result<u32, NftError> {
        let b: [u8; 4] = self
            .data
            .try_into()
            .map_err(|_| malformed(format!("attribute {} is not 4 bytes", self.ty)))?;
        Ok(u32::from_be_bytes(b))
    }

    pub(crate) fn be64(&self) -> Result<u64, NftError> {
        let b: [u8; 8] = self
            .data
            .try_into()
            .map_err(|_| malformed(format!("attribute {} is not 8 bytes", self.ty)))?;
        Ok(u64::from_be_bytes(b))
    }

    /// A string attribute, without the trailing NUL.
    pub(crate) fn string(&self) -> Result<String, NftError> {
        self.str().map(str::to_owned)
    }

    /// [`Attr::string`] borrowed from the buffer (nothing allocated).
    pub(crate) fn str(&self) -> Result<&'a str, NftError> {
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.data.len());
        std::str::from_utf8(&self.data[..end])
            .map_err(|_| malformed(format!("attribute {} is not UTF-8", self.ty)))
    }

    pub(crate) fn nested(&self) -> Attrs<'a> {
        Attrs::new(self.data)
    }
}

/// Iterates over the attributes in a buffer.
#[derive(Debug, Clone)]
pub(crate) struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Attrs { rest: buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, NftError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([self.rest[0], self.rest[1]]) as usize;
        let ty = u16::from_ne_bytes([self.rest[2], self.rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > self.rest.len() {
            self.rest = &[];
            return Some(Err(malformed(format!(
                "attribute {ty} claims {len} bytes, {} left",
                self.rest.len()
            ))));
        }
        let data = &self.rest[4..len];
        self.rest = &self.rest[align(len).min(self.rest.len())..];
        Some(Ok(Attr { ty, data }))
    }
}

pub(crate) fn malformed(msg: String) -> NftError {
    NftError::Malformed(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_padded_and_nested_attributes_and_reads_them_back() {
        let mut buf = Vec::new();
        let mut w = AttrWriter::new(&mut buf);
        w.string(1, "t");
        w.nested(4, |w| {
            w.be32(1, 3);
            w.bytes(2, &[0xff, 0xff, 0xff, 0x9c]);
        });
        assert_eq!(
            buf,
            [
                6, 0, 1, 0, b't', 0, 0, 0, //
                20, 0, 4, 0x80, 8, 0, 1, 0, 0, 0, 0, 3, 8, 0, 2, 0, 0xff, 0xff, 0xff, 0x9c
            ]
        );
        let attrs: Vec<_> = Attrs::new(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].string().unwrap(), "t");
        assert_eq!(attrs[1].ty, 4);
        let inner: Vec<_> = attrs[1].nested().collect::<Result<_, _>>().unwrap();
        assert_eq!(inner[0].be32().unwrap(), 3);
        assert_eq!(inner[1].be32().unwrap() as i32, -100);
    }

    #[test]
    fn rejects_an_attribute_longer_than_its_buffer() {
        let buf = [12u8, 0, 1, 0, 1, 2];
        let r: Result<Vec<_>, _> = Attrs::new(&buf).collect();
        assert!(matches!(r, Err(NftError::Malformed(_))));
    }
}
