//! Any bytes as one Thrift message (binary or compact) to `rpc::handle`: the arguments of
//! every method decoded (within the element bounds) and run against a host with no shards.
//! Nothing may panic, and every reply must be a well-formed message.
#![no_main]

use foqs::core::Caller;
use foqs::rpc::{check_reply, handle, Outcome, Protocol};
use libfuzzer_sys::fuzz_target;

#[path = "fixture.rs"]
mod fixture;
use fixture::fixture;

fuzz_target!(|msg: &[u8]| {
    let f = fixture();
    let caller = Caller::anonymous();
    if let Outcome::Reply(out) = f.rt.block_on(handle(msg, &f.host, &caller, None)) {
        let protocol = Protocol::detect(&out).expect("a reply in a protocol");
        check_reply(protocol, &out).expect("a well-formed reply");
    }
});
