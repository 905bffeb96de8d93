//! What the targets that serve input need: a current-thread runtime and a host with no
//! shards (`Host::detached`), made once per process. Included by each such target.

use std::sync::{Arc, OnceLock};

use foqs::core::Host;

pub struct Fixture {
    pub rt: tokio::runtime::Runtime,
    pub host: Host,
}

pub fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let host = rt.block_on(async { Host::detached(Arc::new(foqs::clock::SystemClock)) });
        Fixture { rt, host }
    })
}
