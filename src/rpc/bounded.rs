//! [`Bounded`]: an input protocol that counts the elements of every list, set and map a
//! message declares, and fails once their sum passes a bound. The crate's
//! `max_container_size` bounds each container alone; a THeader frame of about 256 KiB of
//! zlib inflated to 16 MiB of 17 million one-byte elements, all decoded (and allocated)
//! before any check could refuse the call.

use thrift::protocol::{
    TFieldIdentifier, TInputProtocol, TListIdentifier, TMapIdentifier, TMessageIdentifier,
    TSetIdentifier, TStructIdentifier,
};
use thrift::{ProtocolError, ProtocolErrorKind};

/// Most elements a client's message may declare in all (requests carry at most 1,000
/// items, each with a few short lists).
pub const CLIENT_ELEMENTS_MAX: usize = 20_000;
/// The same for a peer's (`notifyReady` carries up to 10,000 topics with up to 32 heads).
pub const PEER_ELEMENTS_MAX: usize = 400_000;

pub struct Bounded<'a> {
    inner: &'a mut dyn TInputProtocol,
    left: usize,
}

impl<'a> Bounded<'a> {
    pub fn new(inner: &'a mut dyn TInputProtocol, max: usize) -> Bounded<'a> {
        Bounded { inner, left: max }
    }

    fn take(&mut self, n: usize) -> thrift::Result<()> {
        match self.left.checked_sub(n) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(thrift::Error::Protocol(ProtocolError::new(
                ProtocolErrorKind::SizeLimit,
                "the message declares more list, set and map elements in all than a request may carry",
            ))),
        }
    }
}

impl TInputProtocol for Bounded<'_> {
    fn read_message_begin(&mut self) -> thrift::Result<TMessageIdentifier> {
        self.inner.read_message_begin()
    }
    fn read_message_end(&mut self) -> thrift::Result<()> {
        self.inner.read_message_end()
    }
    fn read_struct_begin(&mut self) -> thrift::Result<Option<TStructIdentifier>> {
        self.inner.read_struct_begin()
    }
    fn read_struct_end(&mut self) -> thrift::Result<()> {
        self.inner.read_struct_end()
    }
    fn read_field_begin(&mut self) -> thrift::Result<TFieldIdentifier> {
        self.inner.read_field_begin()
    }
    fn read_field_end(&mut self) -> thrift::Result<()> {
        self.inner.read_field_end()
    }
    fn read_bool(&mut self) -> thrift::Result<bool> {
        self.inner.read_bool()
    }
    fn read_bytes(&mut self) -> thrift::Result<Vec<u8>> {
        self.inner.read_bytes()
    }
    fn read_i8(&mut self) -> thrift::Result<i8> {
        self.inner.read_i8()
    }
    fn read_i16(&mut self) -> thrift::Result<i16> {
        self.inner.read_i16()
    }
    fn read_i32(&mut self) -> thrift::Result<i32> {
        self.inner.read_i32()
    }
    fn read_i64(&mut self) -> thrift::Result<i64> {
        self.inner.read_i64()
    }
    fn read_double(&mut self) -> thrift::Result<f64> {
        self.inner.read_double()
    }
    fn read_uuid(&mut self) -> thrift::Result<uuid::Uuid> {
        self.inner.read_uuid()
    }
    fn read_string(&mut self) -> thrift::Result<String> {
        self.inner.read_string()
    }
    fn read_list_begin(&mut self) -> thrift::Result<TListIdentifier> {
        let l = self.inner.read_list_begin()?;
        self.take(l.size.max(0) as usize)?;
        Ok(l)
    }
    fn read_list_end(&mut self) -> thrift::Result<()> {
        self.inner.read_list_end()
    }
    fn read_set_begin(&mut self) -> thrift::Result<TSetIdentifier> {
        let s = self.inner.read_set_begin()?;
        self.take(s.size.max(0) as usize)?;
        Ok(s)
    }
    fn read_set_end(&mut self) -> thrift::Result<()> {
        self.inner.read_set_end()
    }
    fn read_map_begin(&mut self) -> thrift::Result<TMapIdentifier> {
        let m = self.inner.read_map_begin()?;
        self.take(m.size.max(0) as usize)?;
        Ok(m)
    }
    fn read_map_end(&mut self) -> thrift::Result<()> {
        self.inner.read_map_end()
    }
    fn read_byte(&mut self) -> thrift::Result<u8> {
        self.inner.read_byte()
    }
    fn min_serialized_size(&self, field_type: thrift::protocol::TType) -> usize {
        self.inner.min_serialized_size(field_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use thrift::protocol::{TBinaryInputProtocol, TBinaryOutputProtocol, TOutputProtocol, TType};

    fn lists(sizes: &[i32]) -> Vec<u8> {
        let mut out = Vec::new();
        {
            let mut o = TBinaryOutputProtocol::new(&mut out, true);
            for &n in sizes {
                o.write_list_begin(&TListIdentifier::new(TType::I08, n))
                    .unwrap();
                for _ in 0..n {
                    o.write_i8(1).unwrap();
                }
                o.write_list_end().unwrap();
            }
        }
        out
    }

    fn read_all(bytes: &[u8], lists: usize, max: usize) -> thrift::Result<usize> {
        let mut raw = TBinaryInputProtocol::new(bytes, true);
        let mut p = Bounded::new(&mut raw, max);
        let mut n = 0;
        for _ in 0..lists {
            let l = p.read_list_begin()?;
            for _ in 0..l.size {
                p.read_i8()?;
                n += 1;
            }
        }
        Ok(n)
    }

    #[test]
    fn the_elements_of_every_list_count_against_one_bound() {
        let bytes = lists(&[600, 600]);
        assert_eq!(read_all(&bytes, 2, 1_200).unwrap(), 1_200);
        // Each list alone is within 1,000; both together are not.
        let e = read_all(&bytes, 2, 1_000).unwrap_err();
        assert!(matches!(
            e,
            thrift::Error::Protocol(ProtocolError {
                kind: ProtocolErrorKind::SizeLimit,
                ..
            })
        ));
    }
}
