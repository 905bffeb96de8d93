//! Replica sets of three private MariaDB servers each, started and stopped through
//! `scripts/replicas.sh` (the same servers the drill script and operators use), and the
//! SQL the replication tests read them with (through the `mariadb` client, as root).

use super::free_ports;
use std::path::PathBuf;
use std::process::Command;

pub struct Replicas {
    pub dir: PathBuf,
    /// Server n (1..=3 x sets) listens on `base + n - 1`.
    pub base: u16,
    pub sets: u16,
    /// The certificates every server requires TLS with (`scripts/certs.sh`).
    pub certs: PathBuf,
}

fn script(args: &[&str]) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/scripts/replicas.sh"))
        .args(args)
        .output()
        .expect("run scripts/replicas.sh");
    assert!(
        out.status.success(),
        "replicas.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Replicas {
    /// `sets` replica sets (`scripts/replicas.sh up --sets`): set k (0-based) is servers
    /// 3k+1..3k+3, its first the primary, in region r(k%3+1), the others in the next two.
    /// Every server requires TLS (`require_secure_transport`) and replicates over it, with
    /// certificates made by `scripts/certs.sh` (`certs`).
    pub fn up(sets: u16) -> Replicas {
        let base = free_ports(3 * sets);
        let dir = std::env::temp_dir().join(format!("foqs-replicas-{}-{base}", std::process::id()));
        let certs =
            std::env::temp_dir().join(format!("foqs-replicas-certs-{}-{base}", std::process::id()));
        let root = env!("CARGO_MANIFEST_DIR");
        let ok = Command::new("bash")
            .arg(format!("{root}/scripts/certs.sh"))
            .arg(&certs)
            .output()
            .expect("run scripts/certs.sh");
        assert!(
            ok.status.success(),
            "certs.sh: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let r = Replicas {
            dir,
            base,
            sets,
            certs,
        };
        script(&[
            "up",
            "--dir",
            &r.dir.display().to_string(),
            "--port",
            &base.to_string(),
            "--sets",
            &sets.to_string(),
            "--tls",
            &r.certs.display().to_string(),
        ]);
        r
    }

    /// The servers of set k, its first primary at the start.
    pub fn set_servers(&self, k: u16) -> [u16; 3] {
        [3 * k + 1, 3 * k + 2, 3 * k + 3]
    }

    /// The set server n belongs to.
    pub fn set_of(&self, n: u16) -> u16 {
        (n - 1) / 3
    }

    /// The region of server n ("r1".."r3").
    pub fn region(&self, n: u16) -> String {
        let (k, j) = ((n - 1) / 3, (n - 1) % 3);
        format!("r{}", (k + j) % 3 + 1)
    }

    fn run(&self, args: &[&str]) -> String {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--dir", self.dir.to_str().unwrap()]);
        script(&all)
    }

    pub fn port(&self, n: u16) -> u16 {
        self.base + n - 1
    }

    pub fn addr(&self, n: u16) -> String {
        format!("127.0.0.1:{}", self.port(n))
    }

    /// The server number of "127.0.0.1:PORT".
    pub fn number(&self, addr: &str) -> u16 {
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        port - self.base + 1
    }

    pub fn kill(&self, n: u16) {
        self.run(&["kill", &n.to_string()]);
    }
    pub fn start(&self, n: u16) {
        self.run(&["start", &n.to_string()]);
    }
    pub fn freeze(&self, n: u16) {
        self.run(&["stop", &n.to_string()]);
    }
    pub fn thaw(&self, n: u16) {
        self.run(&["cont", &n.to_string()]);
    }
    /// Restarts n as a replica of `primary` (dropping what no replica acknowledged).
    pub fn rejoin(&self, n: u16, primary: u16) {
        self.run(&["rejoin", &n.to_string(), &self.port(primary).to_string()]);
    }

    /// The rows of `sql` on server n, tab-separated, or None when it does not answer.
    pub fn query(&self, n: u16, sql: &str) -> Option<Vec<String>> {
        let out = Command::new("timeout")
            .args([
                "5",
                "mariadb",
                "--protocol=tcp",
                "-h127.0.0.1",
                "-uroot",
                "-N",
                "--batch",
            ])
            .arg(format!("-P{}", self.port(n)))
            .args(["-e", sql])
            .output()
            .ok()?;
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
    }

    pub fn value(&self, n: u16, sql: &str) -> Option<String> {
        self.query(n, sql)?.into_iter().next()
    }

    pub fn status(&self, n: u16, var: &str) -> i64 {
        self.query(n, &format!("SHOW GLOBAL STATUS LIKE '{var}'"))
            .and_then(|rows| rows.first()?.split('\t').nth(1)?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(format!(
                "{}/scripts/replicas.sh",
                env!("CARGO_MANIFEST_DIR")
            ))
            .args(["down", "--dir", self.dir.to_str().unwrap()])
            .status();
        let _ = std::fs::remove_dir_all(&self.certs);
    }
}
