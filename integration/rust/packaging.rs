//! What packaging and operators rely on outside the API: `foqsd --check-config` accepts
//! every configuration the project ships and refuses a broken one, naming every problem.

use std::path::Path;
use std::process::Command;

fn check(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_foqsd"))
        .arg("--check-config")
        .arg(path)
        .env_remove("FOQS__SERVER__LISTEN")
        .output()
        .expect("run foqsd --check-config");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_shipped_config_passes_check_config() {
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let mut checked = 0;
    for entry in std::fs::read_dir(&conf).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let (ok, text) = check(&path);
        assert!(ok, "{}: {text}", path.display());
        assert!(text.contains("valid"), "{text}");
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} configs under conf/");
}

#[test]
fn a_broken_config_fails_check_config_naming_every_problem() {
    let path = std::env::temp_dir().join(format!("foqs-broken-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[server]\nlisten = \"nowhere\"\n[engine]\nscan_interval_ms = 0\n",
    )
    .unwrap();
    let (ok, text) = check(&path);
    let _ = std::fs::remove_file(&path);
    assert!(!ok, "a broken config passed: {text}");
    for problem in [
        "server.listen \"nowhere\" is not HOST:PORT",
        "no [[shards]]",
        "engine.scan_interval_ms must be > 0",
    ] {
        assert!(text.contains(problem), "missing {problem:?} in: {text}");
    }
    // A file that is not there is a clear error too.
    let (ok, text) = check(Path::new("/nonexistent/foqsd.toml"));
    assert!(!ok && text.contains("/nonexistent/foqsd.toml"), "{text}");
}
