//! Any bytes as one connection's input to the server's own steps (`server::session`):
//! transport detection (framed, unframed, THeader, HTTP), message boundaries, THeader
//! transforms and info headers, then `rpc::handle`. Nothing may panic, and every reply
//! must be well-formed in the framing and protocol of its request. The host has no shards
//! (`Host::detached`), so calls stop after validation; the randomized test in
//! `src/server/session.rs` covers the same path in the normal suite.
#![no_main]

use foqs::core::Caller;
use foqs::rpc::{check_reply, mangle};
use foqs::server::session::replay;
use libfuzzer_sys::fuzz_target;

#[path = "fixture.rs"]
mod fixture;
use fixture::fixture;

/// Small, so that "too large" paths are reached too.
const MAX_BYTES: usize = 64 * 1024;

fuzz_target!(|input: &[u8]| {
    let f = fixture();
    let caller = Caller::anonymous();
    // The input arrives in two pieces, split where its first byte says, as a socket may
    // deliver it.
    let split = input.first().map_or(0, |b| *b as usize * input.len() / 256);
    let (out, _end) = f.rt.block_on(replay(input, &[split], MAX_BYTES, &f.host, &caller));
    for (envelope, bytes) in out {
        match envelope {
            Some(envelope) => {
                let (protocol, msg) = mangle::reply_message(&envelope, &bytes)
                    .expect("every reply is framed as its request");
                check_reply(protocol, &msg).expect("every reply is a well-formed message");
            }
            None => assert!(bytes.starts_with(b"HTTP/1.1 "), "only HTTP writes outside a reply"),
        }
    }
});
