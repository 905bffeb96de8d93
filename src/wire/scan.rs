//! [`Scanner`]: where an unframed Thrift message ends. An unframed client sends messages
//! back to back with no length in front, so the only way to find a message's end is to
//! walk its structure. The scanner does that without decoding (no strings copied, no
//! containers allocated) and is resumable: it keeps its place between calls, so a message
//! that arrives in many small pieces is walked once, not once per piece (fbthrift's
//! server re-parses from the start each time; a client trickling bytes would make that
//! quadratic).

use super::Protocol;

/// Deepest nesting of structs and containers accepted: the Thrift libraries' own
/// recursion limit (64), so nothing a real client sends is refused.
const DEPTH_MAX: usize = 64;

/// What the scanner found.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// The message is the first `n` bytes.
    Complete(usize),
    /// The bytes end inside the message.
    Incomplete,
    /// Not a Thrift message of this protocol.
    Invalid(String),
    /// The message is, or declares a string that makes it, longer than the limit.
    TooLarge,
}

#[derive(Debug, Clone, Copy)]
enum Frame {
    /// Inside a struct; compact field ids are deltas from the last one.
    Struct {
        last_id: i16,
    },
    /// `remaining` values of type `elem` to go (a map's keys and values alternate).
    List {
        elem: u8,
        remaining: u64,
    },
    Map {
        key: u8,
        val: u8,
        remaining: u64,
    },
}

/// Walks one message at a time; after `Complete`, [`Scanner::reset`] starts the next.
#[derive(Debug)]
pub struct Scanner {
    proto: Protocol,
    /// Longest message accepted.
    max_bytes: usize,
    /// Bytes of the message walked so far.
    pos: usize,
    header_done: bool,
    stack: Vec<Frame>,
    /// A field header was read; its value (of this type) comes next.
    pending: Option<u8>,
}

/// Not enough bytes yet: a step is retried whole once more arrive.
struct Short;

type Step<T> = Result<T, StepErr>;

enum StepErr {
    Short,
    Bad(String),
    TooLarge,
}

impl From<Short> for StepErr {
    fn from(_: Short) -> StepErr {
        StepErr::Short
    }
}

fn bad<T>(why: impl Into<String>) -> Step<T> {
    Err(StepErr::Bad(why.into()))
}

/// A cursor over the unread bytes; a failed read leaves the scanner's position alone.
struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
    max_bytes: usize,
}

impl Cursor<'_> {
    /// Skips a string of `n` bytes; one that would end past the limit is refused as soon
    /// as its length is read, without waiting for its bytes.
    fn skip_string(&mut self, n: usize) -> Step<()> {
        if self.at.saturating_add(n) > self.max_bytes {
            return Err(StepErr::TooLarge);
        }
        self.take(n)?;
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Short> {
        let end = self.at.checked_add(n).ok_or(Short)?;
        let s = self.buf.get(self.at..end).ok_or(Short)?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, Short> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, Short> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An unsigned LEB128 varint of at most `max_bytes` bytes.
    fn varint(&mut self, max_bytes: usize) -> Step<u64> {
        let mut v = 0u64;
        for i in 0..max_bytes {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        bad("varint too long")
    }
}

/// Binary protocol type ids.
mod bt {
    pub const STOP: u8 = 0;
    pub const BOOL: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const DOUBLE: u8 = 4;
    pub const I16: u8 = 6;
    pub const I32: u8 = 8;
    pub const I64: u8 = 10;
    pub const STRING: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const MAP: u8 = 13;
    pub const SET: u8 = 14;
    pub const LIST: u8 = 15;
    pub const UUID: u8 = 16;
}

/// Compact protocol type ids (1 and 2 are a bool field's value; in a list, a bool).
mod ct {
    pub const STOP: u8 = 0;
    pub const TRUE: u8 = 1;
    pub const FALSE: u8 = 2;
    pub const BYTE: u8 = 3;
    pub const I16: u8 = 4;
    pub const I32: u8 = 5;
    pub const I64: u8 = 6;
    pub const DOUBLE: u8 = 7;
    pub const BINARY: u8 = 8;
    pub const LIST: u8 = 9;
    pub const SET: u8 = 10;
    pub const MAP: u8 = 11;
    pub const STRUCT: u8 = 12;
    pub const UUID: u8 = 13;
}

impl Scanner {
    pub fn new(proto: Protocol, max_bytes: usize) -> Scanner {
        Scanner {
            proto,
            max_bytes,
            pos: 0,
            header_done: false,
            stack: Vec::new(),
            pending: None,
        }
    }

    /// Forgets the message walked, for the next one.
    pub fn reset(&mut self) {
        *self = Scanner::new(self.proto, self.max_bytes);
    }

    /// Walks on through `buf`, which holds the message from its first byte (and what
    /// came of it before: the scanner remembers how far it got).
    pub fn scan(&mut self, buf: &[u8]) -> Scan {
        loop {
            let mut c = Cursor {
                buf,
                at: self.pos,
                max_bytes: self.max_bytes,
            };
            let step = if !self.header_done {
                self.header(&mut c)
            } else {
                self.step(&mut c)
            };
            match step {
                Ok(done) => {
                    self.pos = c.at;
                    if self.pos > self.max_bytes {
                        return Scan::TooLarge;
                    }
                    if done {
                        return Scan::Complete(self.pos);
                    }
                }
                Err(StepErr::Short) if buf.len() > self.max_bytes => return Scan::TooLarge,
                Err(StepErr::Short) => return Scan::Incomplete,
                Err(StepErr::TooLarge) => return Scan::TooLarge,
                Err(StepErr::Bad(why)) => return Scan::Invalid(why),
            }
        }
    }

    fn header(&mut self, c: &mut Cursor) -> Step<bool> {
        match self.proto {
            Protocol::Binary => {
                let first = c.i32()?;
                if first < 0 {
                    // Strict: 0x8001 then a zero byte and the message type.
                    if (first as u32) >> 16 != 0x8001 {
                        return bad(format!("bad binary version 0x{:08x}", first as u32));
                    }
                    let len = string_len(c.i32()?)?;
                    c.skip_string(len)?;
                    c.i32()?;
                } else {
                    // Non-strict: the name's length, the name, the type, the sequence id.
                    c.skip_string(string_len(first)?)?;
                    c.u8()?;
                    c.i32()?;
                }
            }
            Protocol::Compact => {
                let id = c.u8()?;
                let version = c.u8()? & 0x1f;
                if id != 0x82 || !(1..=2).contains(&version) {
                    return bad(format!("bad compact header 0x{id:02x}, version {version}"));
                }
                c.varint(5)?; // sequence id
                let len = c.varint(5)?;
                c.skip_string(usize::try_from(len).unwrap_or(usize::MAX))?;
            }
        }
        self.header_done = true;
        self.stack.push(Frame::Struct { last_id: 0 });
        Ok(false)
    }

    /// One field header, one value, or the end of a struct or container; true when the
    /// message's argument struct has ended.
    fn step(&mut self, c: &mut Cursor) -> Step<bool> {
        if let Some(ty) = self.pending {
            self.value(c, ty)?;
            self.pending = None;
            return Ok(false);
        }
        let top = self.stack.len() - 1;
        match self.stack[top] {
            Frame::Struct { last_id } => match self.proto {
                Protocol::Binary => {
                    let ty = c.u8()?;
                    if ty == bt::STOP {
                        return Ok(self.pop());
                    }
                    c.i16()?;
                    self.pending = Some(ty);
                }
                Protocol::Compact => {
                    let b = c.u8()?;
                    if b == ct::STOP {
                        return Ok(self.pop());
                    }
                    let (delta, ty) = (b >> 4, b & 0x0f);
                    let id = if delta == 0 {
                        zigzag(c.varint(3)?) as i16
                    } else {
                        last_id.wrapping_add(i16::from(delta))
                    };
                    self.stack[top] = Frame::Struct { last_id: id };
                    // A bool field's value is its type.
                    if ty != ct::TRUE && ty != ct::FALSE {
                        self.pending = Some(ty);
                    }
                }
            },
            Frame::List { elem, remaining } => {
                if remaining == 0 {
                    return Ok(self.pop());
                }
                self.value(c, elem)?;
                self.stack[top] = Frame::List {
                    elem,
                    remaining: remaining - 1,
                };
            }
            Frame::Map {
                key,
                val,
                remaining,
            } => {
                if remaining == 0 {
                    return Ok(self.pop());
                }
                // Keys at even counts from the end, values at odd.
                let ty = if remaining % 2 == 0 { key } else { val };
                self.value(c, ty)?;
                self.stack[top] = Frame::Map {
                    key,
                    val,
                    remaining: remaining - 1,
                };
            }
        }
        Ok(false)
    }

    /// Ends the innermost struct or container; true when it was the message's.
    fn pop(&mut self) -> bool {
        self.stack.pop();
        self.stack.is_empty()
    }

    fn push(&mut self, f: Frame) -> Step<()> {
        if self.stack.len() >= DEPTH_MAX {
            return bad(format!("nested deeper than {DEPTH_MAX}"));
        }
        self.stack.push(f);
        Ok(())
    }

    /// Skips one value of type `ty`, or opens the struct or container it starts.
    fn value(&mut self, c: &mut Cursor, ty: u8) -> Step<()> {
        match self.proto {
            Protocol::Binary => match ty {
                bt::BOOL | bt::BYTE => drop(c.take(1)?),
                bt::I16 => drop(c.take(2)?),
                bt::I32 => drop(c.take(4)?),
                bt::DOUBLE | bt::I64 => drop(c.take(8)?),
                bt::UUID => drop(c.take(16)?),
                bt::STRING => {
                    let n = string_len(c.i32()?)?;
                    c.skip_string(n)?;
                }
                bt::STRUCT => self.push(Frame::Struct { last_id: 0 })?,
                bt::LIST | bt::SET => {
                    let elem = c.u8()?;
                    let n = count(c.i32()?)?;
                    self.push(Frame::List { elem, remaining: n })?;
                }
                bt::MAP => {
                    let (key, val) = (c.u8()?, c.u8()?);
                    let n = count(c.i32()?)?;
                    self.push(Frame::Map {
                        key,
                        val,
                        remaining: n * 2,
                    })?;
                }
                other => return bad(format!("unknown binary type {other}")),
            },
            Protocol::Compact => match ty {
                // In a list or map a bool is one byte.
                ct::TRUE | ct::FALSE | ct::BYTE => drop(c.take(1)?),
                ct::I16 => drop(c.varint(3)?),
                ct::I32 => drop(c.varint(5)?),
                ct::I64 => drop(c.varint(10)?),
                ct::DOUBLE => drop(c.take(8)?),
                ct::UUID => drop(c.take(16)?),
                ct::BINARY => {
                    let n = c.varint(5)?;
                    c.skip_string(usize::try_from(n).unwrap_or(usize::MAX))?;
                }
                ct::STRUCT => self.push(Frame::Struct { last_id: 0 })?,
                ct::LIST | ct::SET => {
                    let h = c.u8()?;
                    let n = match h >> 4 {
                        15 => c.varint(5)?,
                        short => u64::from(short),
                    };
                    self.push(Frame::List {
                        elem: h & 0x0f,
                        remaining: n,
                    })?;
                }
                ct::MAP => {
                    let n = c.varint(5)?;
                    let (key, val) = if n == 0 {
                        (0, 0)
                    } else {
                        let kv = c.u8()?;
                        (kv >> 4, kv & 0x0f)
                    };
                    self.push(Frame::Map {
                        key,
                        val,
                        remaining: n * 2,
                    })?;
                }
                other => return bad(format!("unknown compact type {other}")),
            },
        }
        Ok(())
    }
}

fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn string_len(n: i32) -> Step<usize> {
    usize::try_from(n).or_else(|_| bad(format!("negative length {n}")))
}

fn count(n: i32) -> Step<u64> {
    u64::try_from(n).or_else(|_| bad(format!("negative count {n}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every prefix of a message is incomplete and the whole is complete, fed whole or a
    /// byte at a time; what follows it is left alone.
    fn check(proto: Protocol, msg: &[u8]) {
        let mut s = Scanner::new(proto, 1 << 20);
        assert_eq!(s.scan(msg), Scan::Complete(msg.len()));
        let mut s = Scanner::new(proto, 1 << 20);
        for end in 0..msg.len() {
            assert_eq!(s.scan(&msg[..end]), Scan::Incomplete, "prefix of {end}");
        }
        assert_eq!(s.scan(msg), Scan::Complete(msg.len()));
        let mut two = msg.to_vec();
        two.extend_from_slice(msg);
        let mut s = Scanner::new(proto, 1 << 20);
        assert_eq!(s.scan(&two), Scan::Complete(msg.len()));
    }

    #[test]
    fn every_seed_call_is_found_whole_in_either_protocol() {
        for seed in crate::rpc::mangle::seeds() {
            let proto = if seed[0] == 0x80 {
                Protocol::Binary
            } else {
                Protocol::Compact
            };
            check(proto, &seed);
        }
    }

    #[test]
    fn non_strict_binary_and_hostile_shapes() {
        // Non-strict: name length, name, type (call), sequence id, then an empty struct.
        let mut m = 4u32.to_be_bytes().to_vec();
        m.extend_from_slice(b"peek\x01\x00\x00\x00\x09\x00");
        check(Protocol::Binary, &m);
        // A negative string length.
        let mut m = vec![0x80, 0x01, 0x00, 0x01];
        m.extend_from_slice(&(-3i32).to_be_bytes());
        assert!(matches!(
            Scanner::new(Protocol::Binary, 1 << 20).scan(&m),
            Scan::Invalid(_)
        ));
        // Nesting past the limit: struct fields that open structs, forever.
        let mut m = vec![0x80, 0x01, 0x00, 0x01, 0, 0, 0, 1, b'x', 0, 0, 0, 1];
        for _ in 0..100 {
            m.extend_from_slice(&[bt::STRUCT, 0, 1]);
        }
        assert!(
            matches!(Scanner::new(Protocol::Binary, 1 << 20).scan(&m), Scan::Invalid(w) if w.contains("deeper"))
        );
        // A list that announces four billion bytes: incomplete, not an allocation.
        let mut m = vec![0x82, 0x21, 0x01, 0x01, b'x', 0x19, 0xf3];
        m.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(
            Scanner::new(Protocol::Compact, 1 << 20).scan(&m),
            Scan::Incomplete
        );
        // A string longer than the limit is refused once its length is read.
        let mut m = vec![0x80, 0x01, 0x00, 0x01];
        m.extend_from_slice(&(2u32 << 20).to_be_bytes());
        assert_eq!(
            Scanner::new(Protocol::Binary, 1 << 20).scan(&m),
            Scan::TooLarge
        );
        // A whole message over the limit, arriving at once, is refused too.
        let seed = crate::rpc::mangle::seeds().remove(0);
        assert_eq!(
            Scanner::new(Protocol::Binary, seed.len() - 1).scan(&seed),
            Scan::TooLarge
        );
    }
}
