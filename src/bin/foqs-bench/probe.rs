//! `--phases probe --mysql URL`: a plain MySQL client beside foqsd, no foqs in its path.
//! One connection commits a one-row insert (100 bytes) into a table of its own database
//! (`foqs_bench_probe`, dropped first) at `--rate` commits/s for `--max-seconds`, and
//! reports each commit's latency (`probe_commit`). Run beside the tenants workload on the
//! server foqsd's shards use, it is the floor under a victim's enqueue there: what the
//! server itself answers a lone writer while the flood runs (see docs/tenants.md).

use std::time::{Duration, Instant};

use anyhow::Context;
use mysql_async::prelude::*;

use super::{Latencies, Run};

const DATABASE: &str = "foqs_bench_probe";

impl Run {
    pub(super) fn probe(&self, url: &str, fields: &mut Vec<String>) -> anyhow::Result<()> {
        let rate = self.args.rate.max(1);
        let seconds = self.args.max_seconds;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let lat = rt.block_on(async move {
            let opts = mysql_async::Opts::from_url(url).context("--mysql")?;
            let mut conn = mysql_async::Conn::new(opts).await.context("connecting")?;
            conn.query_drop(format!("DROP DATABASE IF EXISTS {DATABASE}"))
                .await?;
            conn.query_drop(format!("CREATE DATABASE {DATABASE}"))
                .await?;
            conn.query_drop(format!(
                "CREATE TABLE {DATABASE}.t (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARBINARY(200))"
            ))
            .await?;
            let insert = format!("INSERT INTO {DATABASE}.t (v) VALUES (?)");
            let payload = vec![b'x'; 100];
            let mut lat = Latencies::default();
            let every = Duration::from_secs_f64(1.0 / rate as f64);
            let start = Instant::now();
            let end = start + Duration::from_secs(seconds);
            let mut next = start;
            while Instant::now() < end {
                next += every;
                let t0 = Instant::now();
                let mut tx = conn.start_transaction(Default::default()).await?;
                tx.exec_drop(&insert, (&payload,)).await?;
                tx.commit().await?;
                lat.0.push(t0.elapsed().as_micros() as u32);
                tokio::time::sleep_until(next.into()).await;
            }
            conn.query_drop(format!("DROP DATABASE {DATABASE}")).await?;
            let _ = conn.disconnect().await;
            anyhow::Ok(lat)
        })?;
        fields.push(format!("\"probe_commit\":{}", lat.summary_with_p999()));
        Ok(())
    }
}
