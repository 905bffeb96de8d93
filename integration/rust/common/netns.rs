//! A test's own network (`scripts/netns.sh`): one namespace per node, each with its
//! address on a bridge, processes started inside nodes, and nftables cuts between them.
//! Dropping the [`Stage`] kills what it started and removes the network.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicUsize = AtomicUsize::new(0);

pub struct Stage {
    prefix: String,
    subnet: String,
    children: Vec<Child>,
    /// Data directories of the servers it started, removed with it.
    dirs: Vec<PathBuf>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/netns.sh")
}

impl Stage {
    /// A network of `nodes`, its names and subnet this test's own.
    pub fn new(nodes: &[&str]) -> Stage {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let stage = Stage {
            // At most 8 characters: veth names are short.
            prefix: format!("f{}{n}", std::process::id() % 10_000),
            subnet: format!("10.{}.{}", 80 + std::process::id() % 100, n % 250),
            children: Vec::new(),
            dirs: Vec::new(),
        };
        stage.script(&[&["up"], nodes].concat());
        stage
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(script())
            .args(args)
            .env("FOQS_NETNS_PREFIX", &self.prefix)
            .env("FOQS_NETNS_SUBNET", &self.subnet)
            .output()
            .expect("bash scripts/netns.sh");
        assert!(
            out.status.success(),
            "netns.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A node's address.
    pub fn addr(&self, node: &str) -> String {
        self.script(&["addr", node])
    }

    /// `program` to be run inside `node`.
    pub fn command(&self, node: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}-{node}", self.prefix)])
            .arg(program)
            .stdout(Stdio::null());
        c
    }

    /// Starts `command` (from [`Stage::command`]); it is killed when the stage goes, or
    /// by [`Stage::kill`].
    pub fn spawn(&mut self, mut command: Command) -> usize {
        self.children
            .push(command.spawn().expect("spawn inside a namespace"));
        self.children.len() - 1
    }

    /// Waits until `addr` ("ip:port") accepts connections from the test (the host side
    /// of the bridge).
    pub fn wait_listening(&mut self, child: usize, addr: &str, what: &str) {
        let start = Instant::now();
        while std::net::TcpStream::connect_timeout(
            &addr.parse().unwrap(),
            Duration::from_millis(200),
        )
        .is_err()
        {
            if let Ok(Some(status)) = self.children[child].try_wait() {
                panic!("{what} exited before listening: {status}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what} did not start listening on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn data_dir(&mut self, what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("foqs-{}-{what}", self.prefix));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        self.dirs.push(dir.clone());
        dir
    }

    /// A one-member etcd inside `node`; its client endpoint ("ip:2379").
    pub fn etcd(&mut self, node: &str) -> String {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("etcd is installed (scripts/test.sh installs Debian's etcd-server)");
        let addr = self.addr(node);
        let dir = self.data_dir(node);
        let (client, peer) = (format!("http://{addr}:2379"), format!("http://{addr}:2380"));
        let mut c = self.command(node, bin);
        c.args(["--name", node, "--data-dir"])
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("{node}={peer}")])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stderr(Stdio::null());
        let child = self.spawn(c);
        let endpoint = format!("{addr}:2379");
        self.wait_listening(child, &endpoint, "etcd");
        endpoint
    }

    /// A MariaDB server inside `node` that lets anyone in as root (a test's own, on its
    /// own network); its URL without a database ("mysql://root@ip:3306").
    pub fn mariadb(&mut self, node: &str) -> String {
        let addr = self.addr(node);
        let dir = self.data_dir(node);
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let out = Command::new("mariadb-install-db")
            .env("TMPDIR", &tmp)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--user={user}"))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .expect("mariadb-install-db (scripts/test.sh installs mariadb-server)");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bin = ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("mariadb-server is installed");
        let mut c = self.command(node, bin);
        c.env("TMPDIR", &tmp)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .args(["--port=3306", &format!("--bind-address={addr}")])
            .arg(format!("--socket={}", dir.join("sock").display()))
            .arg(format!("--pid-file={}", dir.join("pid").display()))
            .arg(format!("--user={user}"))
            .args(["--skip-name-resolve", "--skip-grant-tables"])
            .args(["--innodb-buffer-pool-size=64M"])
            .arg(format!("--log-error={}", dir.join("error.log").display()))
            .stderr(Stdio::null());
        let child = self.spawn(c);
        self.wait_listening(child, &format!("{addr}:3306"), "mariadbd");
        format!("mysql://root@{addr}:3306")
    }

    /// foqsd inside `node` as host `host_id`, listening on its address; its address.
    pub fn foqsd(&mut self, node: &str, config: &Path, host_id: &str) -> std::net::SocketAddr {
        self.foqsd_with(node, config, host_id, &[]).1
    }

    /// [`Stage::foqsd`] with `env` set (libfaketime, say); its child's index too.
    pub fn foqsd_with(
        &mut self,
        node: &str,
        config: &Path,
        host_id: &str,
        env: &[(&str, String)],
    ) -> (usize, std::net::SocketAddr) {
        let listen = format!("{}:7000", self.addr(node));
        let mut c = self.command(node, env!("CARGO_BIN_EXE_foqsd"));
        c.arg("--config")
            .arg(config)
            .args(["--listen", &listen])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("FOQS__SERVER__HOST_ID", host_id)
            .env(
                "RUST_LOG",
                std::env::var("FOQS_TEST_LOG").unwrap_or("warn".into()),
            )
            .stderr(Stdio::inherit());
        let child = self.spawn(c);
        self.wait_listening(child, &listen, "foqsd");
        (child, listen.parse().unwrap())
    }

    /// SIGKILLs a child the stage started.
    pub fn kill(&mut self, child: usize) {
        let _ = self.children[child].kill();
        let _ = self.children[child].wait();
    }

    /// Cuts `node` off from every other node.
    pub fn isolate(&self, node: &str, others: &[&str]) {
        for o in others.iter().filter(|o| **o != node) {
            self.cut(node, o);
        }
    }

    /// Drops `from`'s packets to `to`, and `to`'s to `from`.
    pub fn cut(&self, from: &str, to: &str) {
        self.script(&["cut", from, to]);
    }

    /// Drops `from`'s packets to `to` only (`to`'s still reach `from`).
    pub fn cut_one_way(&self, from: &str, to: &str) {
        self.script(&["cut", from, to, "--one-way"]);
    }

    /// Removes every cut.
    pub fn heal(&self) {
        self.script(&["heal"]);
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .env("FOQS_NETNS_PREFIX", &self.prefix)
            .env("FOQS_NETNS_SUBNET", &self.subnet)
            .output();
    }
}
