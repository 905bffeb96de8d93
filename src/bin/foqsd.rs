//! `foqsd`: the foqs host. Parses flags, sets up logging, and runs [`foqs::daemon`] until
//! SIGTERM or SIGINT, then shuts down gracefully and exits 0.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use foqs::clock::SystemClock;
use foqs::config::{Config, LogFormat};

#[derive(Parser)]
#[command(
    version,
    about = "foqsd: the foqs priority-queue host (FOQS over sharded MySQL or local SQLite files)"
)]
struct Args {
    /// The TOML configuration file (every key overridable as FOQS__SECTION__KEY).
    #[arg(long, default_value = "conf/foqsd.toml")]
    config: PathBuf,
    /// HOST:PORT to listen on, overriding server.listen.
    #[arg(long)]
    listen: Option<String>,
    /// Checks FILE as --config would load it (environment overrides included, TLS files
    /// read) and exits: 0 when it is valid, 1 with every problem found otherwise.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["config", "listen"])]
    check_config: Option<PathBuf>,
}

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Logs go to stderr: coloured only on a terminal (a log file gets no escape
/// sequences), or one JSON object per line with `log.format = "json"`.
fn init_logs(format: LogFormat) {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => logs.json().flatten_event(true).init(),
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(path) = &args.check_config {
        // The problems alone (no backtrace, whatever RUST_BACKTRACE says): for scripts.
        if let Err(e) = check_config(path).await {
            eprintln!("foqsd: {e:#}");
            std::process::exit(1);
        }
        return Ok(());
    }
    let mut cfg =
        Config::load(&args.config).with_context(|| format!("loading {}", args.config.display()))?;
    if let Some(listen) = args.listen {
        cfg.server.listen = listen;
        cfg.validate()?;
    }
    init_logs(cfg.log.format);
    // Test builds only: failpoints named in the FAILPOINTS variable, so that a test can
    // stop a foqsd process at a chosen point (and kill it there).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let running = foqs::daemon::start(&cfg, Arc::new(SystemClock)).await?;
    wait_for_signal().await?;
    tracing::info!("shutting down");
    running.shutdown().await;
    tracing::info!("bye");
    // A shard left behind may still have a thread in a hung disk call: the runtime would
    // wait for it when dropped. Everything this process had to save is saved.
    std::process::exit(0)
}

/// `--check-config`: what a start would refuse, without starting; and, with replicated
/// shards, what the replication admin account may not do on each server (a switch would
/// fail there): a missing privilege fails the check, a server that does not answer is
/// only reported.
async fn check_config(path: &std::path::Path) -> anyhow::Result<()> {
    let cfg = Config::load(path).with_context(|| format!("checking {}", path.display()))?;
    if let Some(t) = &cfg.server.tls {
        foqs::tls::server_config(t).with_context(|| format!("checking {}", path.display()))?;
    }
    let (mut lacking, mut unsafe_settings) = (Vec::new(), Vec::new());
    for (server, r) in foqs::replication::grants::check_servers(&cfg).await {
        match r {
            Ok(f) => {
                if f.lacks.is_empty() {
                    println!("{server}: the admin account may do every switch step");
                } else {
                    println!("{server}: the admin account lacks {}", f.lacks.join(", "));
                    lacking.push(format!("{server}: GRANT {}", f.lacks.join(", ")));
                }
                if f.settings.is_empty() {
                    println!("{server}: its settings keep what foqs stores");
                } else {
                    println!("{server}: set {}", f.settings.join("; "));
                    unsafe_settings.push(format!("{server}: {}", f.settings.join("; ")));
                }
            }
            Err(e) => println!("{server}: not checked ({e})"),
        }
    }
    let mut refused = Vec::new();
    if !lacking.is_empty() {
        refused.push(format!(
            "the replication admin account ({}) lacks privileges a switch needs: {}",
            cfg.replication.admin_user,
            lacking.join("; ")
        ));
    }
    if !unsafe_settings.is_empty() {
        refused.push(format!(
            "servers lack settings the guarantees rest on: {}",
            unsafe_settings.join(" | ")
        ));
    }
    if !refused.is_empty() {
        anyhow::bail!("{}", refused.join("; and "));
    }
    println!(
        "{}: valid ({} shards, cluster.manager = {}, listen {})",
        path.display(),
        cfg.shards.len(),
        format!("{:?}", cfg.cluster.manager).to_lowercase(),
        cfg.server.listen
    );
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
