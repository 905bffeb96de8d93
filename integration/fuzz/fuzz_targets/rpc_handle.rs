//! Any bytes as one frame to `rpc::handle`, the entry point every connection feeds: it must
//! not panic, and a reply must be a well-formed message of the frame's protocol. The host
//! has no shards (`Host::detached`), so calls stop after validation; the randomized test in
//! `src/rpc/mod.rs` covers the same path in the normal suite.
#![no_main]

use std::sync::{Arc, OnceLock};

use foqs::core::{Caller, Host};
use foqs::rpc::{check_reply, handle, Outcome, Protocol};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|frame: &[u8]| {
    if frame.is_empty() {
        return; // the server never hands an empty frame to handle()
    }
    let f = fixture();
    if let Outcome::Reply(reply) = f.rt.block_on(handle(frame, &f.host, &f.caller)) {
        let protocol = Protocol::detect(frame).expect("a reply means a known protocol");
        check_reply(protocol, &reply).expect("every reply is a well-formed message");
    }
});
