//! Any bytes, fed in pieces, to the sans-I/O frame detector and splitter
//! (`wire::Decoder`): it must never panic, never ask for more than its buffer bound, and
//! every message it finds must lie inside the bytes it was given.
#![no_main]

use foqs::wire::{Decoder, Next};
use libfuzzer_sys::fuzz_target;

const MAX_BYTES: usize = 64 * 1024;

fuzz_target!(|input: &[u8]| {
    let mut decoder = Decoder::new(MAX_BYTES);
    let step = 1 + input.first().map_or(0, |b| *b as usize) % 64;
    let mut end = 0;
    let mut start = 0;
    while end < input.len() {
        end = (end + step).min(input.len());
        loop {
            match decoder.next(&input[start..end]) {
                Next::Need => break,
                Next::Request(r) => {
                    assert!(r.consumed > 0 && r.consumed <= end - start, "{r:?}");
                    start += r.consumed;
                }
                Next::Interim(_) => continue,
                Next::Exception { consumed, .. } => {
                    assert!(consumed > 0 && consumed <= end - start);
                    start += consumed;
                }
                Next::Close { .. } => return,
            }
        }
    }
});
