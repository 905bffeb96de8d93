//! A private MariaDB for fault tests: its own datadir, port and socket, started and killed
//! by the test (never the shared server). SIGSTOP/SIGCONT make it hang and recover.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PrivateMariaDb {
    dir: PathBuf,
    pub port: u16,
    child: Child,
}

fn mariadbd() -> String {
    ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("mariadb-server is installed (scripts/test.sh installs it)")
        .to_string()
}

impl PrivateMariaDb {
    pub fn start() -> PrivateMariaDb {
        Self::start_with(&[])
    }

    /// Started with `extra` server options (TLS files, say) after the usual ones.
    pub fn start_with(extra: &[String]) -> PrivateMariaDb {
        let port = super::free_port();
        let dir = std::env::temp_dir().join(format!("foqs-mariadb-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        // Each server its own temporary directory: concurrent bootstraps sharing /tmp
        // have been seen to remove each other's temporary tables.
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let out = Command::new("mariadb-install-db")
            .env("TMPDIR", &tmp)
            .args([
                "--no-defaults",
                &format!("--datadir={}", dir.join("data").display()),
                &format!("--user={user}"),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .output()
            .expect("mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let child = Command::new(mariadbd())
            .env("TMPDIR", &tmp)
            .args([
                "--no-defaults",
                &format!("--datadir={}", dir.join("data").display()),
                &format!("--port={port}"),
                "--bind-address=127.0.0.1",
                &format!("--socket={}", dir.join("sock").display()),
                &format!("--pid-file={}", dir.join("pid").display()),
                &format!("--user={user}"),
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=64M",
                &format!("--log-error={}", dir.join("error.log").display()),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mariadbd");
        let db = PrivateMariaDb { dir, port, child };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "private MariaDB did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        db
    }

    /// Runs `sql` as root through the `mariadb` client (no TLS: before the server
    /// requires it).
    pub fn sql(&self, sql: &str) {
        let out = Command::new("mariadb")
            .args(["--protocol=tcp", "-h127.0.0.1", "-uroot"])
            .arg(format!("-P{}", self.port))
            .args(["-e", sql])
            .output()
            .expect("mariadb client");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// The server stops answering (connections hang) until `resume`.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill(); // SIGKILL also ends a stopped process
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
