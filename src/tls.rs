//! TLS with rustls (ring provider; no OpenSSL): the server's configuration from PEM files
//! (`[server.tls]`), the client side used by foqsctl, the tests and peer hosts, and a
//! caller's identity taken from its certificate.
//!
//! Identity: the client certificate's first DNS subject alternative name, else its
//! subject common name; without TLS, or without a client certificate, `anonymous`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::Deserialize;

/// The identity of a caller that presented no certificate (or spoke plain TCP).
pub const ANONYMOUS: &str = "anonymous";

/// `[server.tls]`: with it, the Thrift port speaks TLS only.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// The certificate chain, PEM.
    pub cert_file: PathBuf,
    /// The private key, PEM (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key_file: PathBuf,
    /// When set, every client must present a certificate signed by this CA (mTLS).
    pub client_ca_file: Option<PathBuf>,
    /// Certificate revocation lists (PEM) of the client CA: a client whose certificate is
    /// revoked is refused at the handshake. Read at start.
    pub crl_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {why}")]
    File { path: String, why: String },
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls: {0}")]
    Verifier(String),
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate in the file"));
    }
    Ok(certs)
}

/// Every certificate revocation list in a PEM file (at least one).
fn load_crls(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateRevocationListDer<'static>>, TlsError> {
    let crls = rustls::pki_types::CertificateRevocationListDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if crls.is_empty() {
        return Err(file_error(
            path,
            "no certificate revocation list in the file",
        ));
    }
    Ok(crls)
}

/// The first private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

fn roots(ca_file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(ca_file)? {
        roots.add(c).map_err(|e| file_error(ca_file, e))?;
    }
    Ok(roots)
}

/// The Thrift port's TLS: the acceptor, and (with `cluster.peer_ca_file`) what tells a
/// peer host's certificate from a client's.
pub struct ServerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    peer_ca: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
}

impl ServerTls {
    /// Reads the files (`peer_ca_file`: the CA of the cluster's hosts' certificates).
    pub fn new(cfg: &ServerTlsConfig, peer_ca_file: Option<&Path>) -> Result<ServerTls, TlsError> {
        let peer_ca = match peer_ca_file {
            Some(p) => Some(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(p)?), provider())
                    .build()
                    .map_err(|e| TlsError::Verifier(e.to_string()))?,
            ),
            None => None,
        };
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(server_config_with(cfg, peer_ca_file)?),
            peer_ca,
        })
    }

    /// Whether a client's certificate chain was issued by the peers' CA: then it is a host
    /// of the cluster, whatever its name (a client certificate never is).
    pub fn is_peer_certificate(&self, chain: Option<&[CertificateDer<'_>]>) -> bool {
        let (Some(v), Some((leaf, rest))) = (&self.peer_ca, chain.and_then(|c| c.split_first()))
        else {
            return false;
        };
        v.verify_client_cert(leaf, rest, rustls::pki_types::UnixTime::now())
            .is_ok()
    }
}

/// The server's TLS configuration; with a client CA, client certificates are required.
pub fn server_config(cfg: &ServerTlsConfig) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with(cfg, None)
}

/// The same, taking client certificates of the peers' CA too.
fn server_config_with(
    cfg: &ServerTlsConfig,
    peer_ca_file: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = load_certs(&cfg.cert_file)?;
    let key = load_key(&cfg.key_file)?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &cfg.client_ca_file {
        Some(ca) => {
            let mut roots = roots(ca)?;
            if let Some(p) = peer_ca_file {
                for c in load_certs(p)? {
                    roots.add(c).map_err(|e| file_error(p, e))?;
                }
            }
            let mut verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            if let Some(path) = &cfg.crl_file {
                verifier = verifier.with_crls(load_crls(path)?);
            }
            let verifier = verifier
                .build()
                .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_single_cert(certs, key)?))
}

/// What a client needs to speak TLS to foqsd: the CA that signed the server's
/// certificate, and its own certificate and key when the server requires one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// True when any file is given: the client then speaks TLS.
    pub fn enabled(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some()
    }
}

/// A client configuration; the server's certificate must chain to `ca_file`.
pub fn client_config(files: &ClientTlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let ca = files
        .ca_file
        .as_ref()
        .ok_or_else(|| TlsError::Verifier("a CA file is needed to verify the server".into()))?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca)?);
    let cfg = match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            builder.with_client_auth_cert(load_certs(cert)?, load_key(key)?)?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(TlsError::Verifier(
                "a client certificate needs its key, and a key its certificate".into(),
            ))
        }
    };
    Ok(Arc::new(cfg))
}

/// The name to verify the server's certificate against: the host part of `addr`
/// (`127.0.0.1:9090` → the IP address 127.0.0.1; `[::1]:9090`; `foqs.example:9090`).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let host = match addr.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| TlsError::Verifier(format!("{host:?} cannot name a TLS server: {e}")))
}

/// The caller's identity from its certificate chain (the first is its own).
pub fn identity(chain: Option<&[CertificateDer<'_>]>) -> String {
    let Some(cert) = chain.and_then(|c| c.first()) else {
        return ANONYMOUS.to_string();
    };
    let Ok((_, x509)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return ANONYMOUS.to_string();
    };
    if let Ok(Some(san)) = x509.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                return dns.to_string();
            }
        }
    }
    let cn = x509
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    cn.unwrap_or_else(|| ANONYMOUS.to_string())
}

/// A blocking TLS stream shared by a reader and a writer half (Thrift's sync transports
/// take them apart); calls are sequential, so the lock is never contended.
#[derive(Clone)]
pub struct SyncTlsStream(Arc<Mutex<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>>);

impl SyncTlsStream {
    pub fn connect(
        stream: TcpStream,
        addr: &str,
        cfg: Arc<ClientConfig>,
    ) -> Result<SyncTlsStream, TlsError> {
        let conn = rustls::ClientConnection::new(cfg, server_name(addr)?)?;
        let mut s = rustls::StreamOwned::new(conn, stream);
        // Handshake now, so that a refused certificate fails the connect, not a call.
        while s.conn.is_handshaking() {
            s.conn
                .complete_io(&mut s.sock)
                .map_err(|e| TlsError::Verifier(format!("handshake with {addr}: {e}")))?;
        }
        Ok(SyncTlsStream(Arc::new(Mutex::new(s))))
    }
}

impl Read for SyncTlsStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").read(buf)
    }
}

impl Write for SyncTlsStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().expect("not poisoned").flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        assert!(matches!(
            server_name("127.0.0.1:9090").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:9090").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("foqs.example:9090").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(matches!(
            server_name("localhost").unwrap(),
            ServerName::DnsName(_)
        ));
    }

    #[test]
    fn no_certificate_is_anonymous() {
        assert_eq!(identity(None), ANONYMOUS);
        assert_eq!(identity(Some(&[])), ANONYMOUS);
        assert_eq!(
            identity(Some(&[CertificateDer::from(vec![1, 2, 3])])),
            ANONYMOUS
        );
    }
}
