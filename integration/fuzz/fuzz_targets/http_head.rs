//! Any bytes as the start of an HTTP request on the Thrift port: `wire::http::head`
//! finds the head's end and the body's length, or refuses. It must never panic.
#![no_main]

use foqs::wire::http::head;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|buf: &[u8]| {
    let _ = head(buf, 64 * 1024);
});
