//! Any bytes as a THeader frame (without its length): `wire::header::parse` reads the
//! header, its info blocks and transforms (zlib inflated within the bound). It must never
//! panic, and a payload it returns must stay within the bound.
#![no_main]

use foqs::wire::header::{parse, Payload};
use libfuzzer_sys::fuzz_target;

const MAX_BYTES: usize = 64 * 1024;

fuzz_target!(|frame: &[u8]| {
    if let Ok(r) = parse(frame, MAX_BYTES) {
        match r.payload {
            Payload::Slice(s) => assert!(s.end <= frame.len() && s.start <= s.end),
            Payload::Owned(v) => assert!(v.len() <= MAX_BYTES),
        }
    }
});
