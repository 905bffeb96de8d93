//! Real processes for tests: `foqsd` (the built binary) and a private `etcd`, each on
//! 127.0.0.1 ports of its own, killed when the test lets go of it.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

fn wait_listening(addr: SocketAddr, what: &str, child: &mut Child) {
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited before listening: {status}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not start listening on {addr}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A `foqsd` process.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Proc {
    /// Starts foqsd with `config` on a free port, `env` added to its environment.
    pub fn spawn(config: &Path, env: &[(&str, &str)]) -> Proc {
        Self::spawn_on(config, free_port(), env)
    }

    pub fn spawn_on(config: &Path, port: u16, env: &[(&str, &str)]) -> Proc {
        Self::start(config, port, env, Stdio::inherit())
    }

    /// As [`Proc::spawn`], its log (stderr) written to `stderr` (a test reads it for a
    /// signal: a failpoint reached).
    pub fn spawn_with_stderr(config: &Path, env: &[(&str, &str)], stderr: std::fs::File) -> Proc {
        Self::start(config, free_port(), env, Stdio::from(stderr))
    }

    fn start(config: &Path, port: u16, env: &[(&str, &str)], stderr: Stdio) -> Proc {
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_foqsd"))
            .args([
                "--config",
                config.to_str().unwrap(),
                "--listen",
                &addr.to_string(),
            ])
            .env(
                "RUST_LOG",
                std::env::var("FOQS_TEST_LOG").unwrap_or("warn".into()),
            )
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn foqsd");
        wait_listening(addr, "foqsd", &mut child);
        Proc { child, addr }
    }

    pub fn sigterm(&mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        self.child.wait().unwrap()
    }

    pub fn sigkill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private single-member etcd with its own data directory and ports.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub endpoint: String,
}

impl Etcd {
    pub fn start() -> Etcd {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("etcd is installed (scripts/test.sh installs Debian's etcd-server)");
        let (client, peer) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("foqs-etcd-{}-{client}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut child = Command::new(bin)
            .args([
                "--name",
                "foqs-test",
                "--data-dir",
                dir.to_str().unwrap(),
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("foqs-test={peer_url}"),
            ])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn etcd");
        wait_listening(
            format!("127.0.0.1:{client}").parse().unwrap(),
            "etcd",
            &mut child,
        );
        Etcd {
            child,
            dir,
            endpoint: format!("127.0.0.1:{client}"),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
