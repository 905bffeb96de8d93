//! Any bytes as one connection's input to the server's own steps (`server::session`):
//! transport detection (framed, unframed, THeader, HTTP), message boundaries, THeader
//! transforms and info headers, then `rpc::handle`. Nothing may panic, and every reply
//! must be well-formed in the framing and protocol of its request. The host has no shards
//! (`Host::detached`), so calls stop after validation; the randomized test in
//! `src/server/session.rs` covers the same path in the normal suite.
#![no_main]

use std::sync::{Arc, OnceLock};

use foqs::core::{Caller, Host};
use foqs::rpc::{check_reply, mangle};
use foqs::server::session::replay;
use libfuzzer_sys::fuzz_target;

/// Small, so that "too large" paths are reached too.
const MAX_BYTES: usize = 64 * 1024;

struct Fixture {
    rt: tokio::runtime::Runtime,
    host: Host,
    caller: Caller,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let host = rt.block_on(async { Host::detached(Arc::new(foqs::clock::SystemClock)) });
        Fixture {
            rt,
            host,
            caller: Caller::anonymous(),
        }
    })
}

fuzz_target!(|input: &[u8]| {
    let f = fixture();
    // The input arrives in two pieces, split where its first byte says, as a socket may
    // deliver it.
    let split = input.first().map_or(0, |b| *b as usize * input.len() / 256);
    let (out, _end) = f.rt.block_on(replay(input, &[split], MAX_BYTES, &f.host, &f.caller));
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
