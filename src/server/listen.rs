//! Opening a listening socket with an explicit `listen(2)` backlog. tokio's
//! `TcpListener::bind` asks for 1024; when more clients than the backlog connect at once
//! (a fleet reconnecting after a restart), the kernel drops their SYNs, and a client
//! whose handshake it then completes from a SYN cookie while the queue is still full may
//! be reset: the client sees a connection reset before any reply.

use std::io;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpSocket};

/// Where the kernel says how far it caps any listen backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds the first address `addr` resolves to and listens with `backlog`. Warns when the
/// kernel caps the backlog below it.
pub async fn listen(addr: &str, backlog: u32) -> io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        match listen_at(a, backlog) {
            Ok(l) => {
                warn_if_capped(addr, backlog);
                return Ok(l);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address resolves to nothing",
        )
    }))
}

fn listen_at(a: SocketAddr, backlog: u32) -> io::Result<TcpListener> {
    let socket = if a.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As TcpListener::bind: a restarted foqsd can listen while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(a)?;
    socket.listen(backlog)
}

fn warn_if_capped(addr: &str, backlog: u32) {
    let cap = std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    if let Some(cap) = cap.filter(|&c| c < backlog) {
        tracing::warn!(
            addr,
            backlog,
            somaxconn = cap,
            "the kernel caps the listen backlog at net.core.somaxconn; clients connecting \
             together beyond it may be refused or reset (raise it with sysctl)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn listens_on_a_resolved_address_and_refuses_a_taken_one() {
        let l = listen("localhost:0", 16).await.unwrap();
        let at = l.local_addr().unwrap();
        assert!(at.ip().is_loopback());
        let c = tokio::net::TcpStream::connect(at).await.unwrap();
        let (_s, peer) = l.accept().await.unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        let taken = listen(&at.to_string(), 16).await.unwrap_err();
        assert_eq!(taken.kind(), io::ErrorKind::AddrInUse);
        assert!(listen("no-such-host.invalid:1", 16).await.is_err());
    }
}
