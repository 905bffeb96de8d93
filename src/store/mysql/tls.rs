//! TLS to MySQL/MariaDB (`mysql_async` over rustls, no OpenSSL): a shard's data, owner-lock
//! and heartbeat connections, and the replication admin's, each to the servers whose
//! settings name it (see `[[shards]] tls` in docs/configuration.md).

use mysql_async::{ClientIdentity, OptsBuilder, SslOpts};
use serde::Deserialize;

/// `tls = { ca_file = "...", cert_file = "...", key_file = "...", verify_server_name = true }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MysqlTls {
    /// PEM file of the CA(s) the server's certificate must chain to (beside the public
    /// web roots `mysql_async` always trusts).
    pub ca_file: String,
    /// PEM certificate chain and key this client presents (for `REQUIRE X509` accounts);
    /// both or neither. The key must be RSA in PKCS#1 PEM (all `mysql_async` 0.34 reads).
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
    /// The certificate must name the host the URL connects to. Off only for servers
    /// reached by an address their certificate does not name (the CA still vouches).
    #[serde(default = "yes")]
    pub verify_server_name: bool,
}

fn yes() -> bool {
    true
}

impl MysqlTls {
    /// What is wrong with these settings (files that cannot be read, half a client
    /// identity), for the config check.
    pub fn problems(&self, what: &str) -> Vec<String> {
        let mut p = Vec::new();
        for (key, f) in [
            ("ca_file", Some(&self.ca_file)),
            ("cert_file", self.cert_file.as_ref()),
            ("key_file", self.key_file.as_ref()),
        ] {
            if let Some(f) = f {
                if let Err(e) = std::fs::metadata(f) {
                    p.push(format!("{what}.tls.{key} {f:?}: {e}"));
                }
            }
        }
        if let Some(k) = &self.key_file {
            let pem = std::fs::read_to_string(k).unwrap_or_default();
            if !pem.is_empty() && !pem.contains("BEGIN RSA PRIVATE KEY") {
                p.push(format!(
                    "{what}.tls.key_file {k:?}: mysql_async reads a client key only as RSA in PKCS#1 PEM \
                     (\"BEGIN RSA PRIVATE KEY\"); convert an RSA key with `openssl rsa -traditional`"
                ));
            }
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            p.push(format!(
                "{what}.tls: cert_file and key_file go together (a client certificate needs its key)"
            ));
        }
        p
    }

    fn ssl_opts(&self) -> SslOpts {
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => Some(ClientIdentity::new(
                std::path::PathBuf::from(c).into(),
                std::path::PathBuf::from(k).into(),
            )),
            _ => None,
        };
        SslOpts::default()
            .with_root_certs(vec![std::path::PathBuf::from(&self.ca_file).into()])
            .with_client_identity(identity)
            .with_danger_skip_domain_validation(!self.verify_server_name)
    }
}

/// `opts` with `tls` on (or as they are without it).
pub fn with_tls(opts: OptsBuilder, tls: Option<&MysqlTls>) -> OptsBuilder {
    match tls {
        Some(t) => {
            ring_by_default();
            opts.ssl_opts(t.ssl_opts())
        }
        None => opts,
    }
}

/// `mysql_async` builds its rustls configuration from the process's default crypto
/// provider, and its dependency on rustls brings a second provider beside the ring one
/// the rest of foqs uses: with two, rustls will not choose. Ring it is, once.
fn ring_by_default() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::MysqlTls;

    #[test]
    fn a_client_key_mysql_async_cannot_read_is_named_at_the_config_check() {
        let dir = std::env::temp_dir().join(format!("foqs-mysql-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |n: &str, body: &str| {
            let p = dir.join(n);
            std::fs::write(&p, body).unwrap();
            p.display().to_string()
        };
        let tls = |cert: Option<String>, key: Option<String>| MysqlTls {
            ca_file: file("ca.pem", "-----BEGIN CERTIFICATE-----\n"),
            cert_file: cert,
            key_file: key,
            verify_server_name: true,
        };
        let cert = file("c.pem", "-----BEGIN CERTIFICATE-----\n");
        let rsa = file("rsa.key", "-----BEGIN RSA PRIVATE KEY-----\n");
        let pkcs8 = file("ec.key", "-----BEGIN PRIVATE KEY-----\n");
        assert!(tls(Some(cert.clone()), Some(rsa)).problems("s").is_empty());
        let p = tls(Some(cert.clone()), Some(pkcs8))
            .problems("s")
            .join("; ");
        assert!(p.contains("PKCS#1"), "{p}");
        let p = tls(Some(cert), None).problems("s").join("; ");
        assert!(p.contains("go together"), "{p}");
        let mut missing = tls(None, None);
        missing.ca_file = dir.join("nope.pem").display().to_string();
        assert!(missing.problems("s")[0].contains("s.tls.ca_file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
