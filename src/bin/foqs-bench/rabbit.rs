//! The same workload against RabbitMQ (`--rabbitmq URL`), for a reference row measured in
//! the same run as foqs: a durable queue with `x-max-priority` 10, persistent messages,
//! publisher confirms (a producer publishes a batch and waits for all its confirms, as a
//! foqs enqueue call waits for its commit) and manual acks (a consumer with a prefetch
//! of one batch acks each batch with `multiple`, as a foqs consumer acks each dequeue).
//! Through lapin, RabbitMQ's maintained AMQP 0.9.1 client for tokio.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use super::{rate, Args, Latencies};

struct Rabbit {
    args: Args,
    url: String,
    queue: String,
}

impl Rabbit {
    async fn connect(&self) -> anyhow::Result<Connection> {
        Connection::connect(&self.url, ConnectionProperties::default())
            .await
            .with_context(|| format!("connecting to RabbitMQ at {}", self.url))
    }

    async fn produce(
        self: &Arc<Self>,
        items: u64,
        deadline: Instant,
    ) -> anyhow::Result<(Duration, Latencies)> {
        let next = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for p in 0..self.args.producers {
            let me = self.clone();
            let next = next.clone();
            tasks.push(tokio::spawn(async move {
                let conn = me.connect().await?;
                let ch = conn.create_channel().await?;
                ch.confirm_select(ConfirmSelectOptions::default()).await?;
                let payload = vec![b'x'; me.args.payload_bytes];
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (p as u64 + 1);
                let mut lat = Vec::new();
                loop {
                    let first = next.fetch_add(me.args.batch as u64, Ordering::SeqCst);
                    if first >= items || Instant::now() > deadline {
                        break;
                    }
                    let n = (items - first).min(me.args.batch as u64);
                    let t = Instant::now();
                    let mut confirms = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        // foqs: lower is more urgent; AMQP: higher is.
                        let priority = 9 - (seed % 10) as u8;
                        let props = BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_priority(priority);
                        confirms.push(
                            ch.basic_publish(
                                "".into(),
                                me.queue.as_str().into(),
                                BasicPublishOptions::default(),
                                &payload,
                                props,
                            )
                            .await?,
                        );
                    }
                    for c in confirms {
                        let c = c.await?;
                        anyhow::ensure!(c.is_ack(), "RabbitMQ refused a message: {c:?}");
                    }
                    lat.push(t.elapsed().as_micros() as u32);
                }
                let _ = conn.close(200, "done".into()).await;
                anyhow::Ok(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        Ok((start.elapsed(), Latencies(all)))
    }

    async fn consume(
        self: &Arc<Self>,
        items: u64,
        deadline: Instant,
        producing: Arc<AtomicBool>,
    ) -> anyhow::Result<(Duration, Latencies, u64)> {
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..self.args.consumers {
            let me = self.clone();
            let done = done.clone();
            let producing = producing.clone();
            tasks.push(tokio::spawn(async move {
                let conn = me.connect().await?;
                let ch = conn.create_channel().await?;
                ch.basic_qos(me.args.batch as u16, BasicQosOptions::default())
                    .await?;
                let mut consumer = ch
                    .basic_consume(
                        me.queue.as_str().into(),
                        format!("bench-{c}").as_str().into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                let mut lat = Vec::new();
                let mut held = 0usize;
                let mut last = None;
                let mut t = Instant::now();
                while done.load(Ordering::SeqCst) < items && Instant::now() < deadline {
                    // A batch is what arrived until it is full or nothing more comes.
                    let got = tokio::time::timeout(Duration::from_millis(5), consumer.next()).await;
                    match got {
                        Ok(Some(d)) => {
                            if held == 0 {
                                t = Instant::now();
                            }
                            held += 1;
                            last = Some(d?);
                            if held < me.args.batch {
                                continue;
                            }
                        }
                        Ok(None) => break,
                        Err(_) if held == 0 => {
                            if !producing.load(Ordering::SeqCst)
                                && done.load(Ordering::SeqCst) >= items
                            {
                                break;
                            }
                            continue;
                        }
                        Err(_) => {}
                    }
                    if let Some(d) = last.take() {
                        d.ack(BasicAckOptions { multiple: true }).await?;
                        lat.push(t.elapsed().as_micros() as u32);
                        done.fetch_add(held as u64, Ordering::SeqCst);
                        held = 0;
                    }
                }
                let _ = conn.close(200, "done".into()).await;
                anyhow::Ok(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        Ok((start.elapsed(), Latencies(all), done.load(Ordering::SeqCst)))
    }
}

/// Runs the phases against RabbitMQ; the same JSON fields as against foqsd.
pub fn run(
    args: &Args,
    url: &str,
    phases: &[&str],
    fields: &mut Vec<String>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis();
        let me = Arc::new(Rabbit {
            args: args.clone(),
            url: url.to_string(),
            queue: format!("foqs-bench-{}-{t}", std::process::id()),
        });
        let conn = me.connect().await?;
        let ch = conn.create_channel().await?;
        let mut qargs = FieldTable::default();
        qargs.insert("x-max-priority".into(), AMQPValue::ShortShortUInt(10));
        ch.queue_declare(
            me.queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            qargs,
        )
        .await?;
        let limit = Duration::from_secs(args.max_seconds);
        let idle = Arc::new(AtomicBool::new(false));
        for phase in phases {
            match *phase {
                "enqueue" => {
                    let (d, lat) = me.produce(args.items, Instant::now() + limit).await?;
                    fields.push(format!(
                        "\"enqueue_items_per_s\":{:.0}",
                        rate(args.items, d)
                    ));
                    fields.push(format!("\"enqueue_latency\":{}", lat.summary()));
                }
                "drain" => {
                    let (d, lat, n) = me
                        .consume(args.items, Instant::now() + limit, idle.clone())
                        .await?;
                    fields.push(format!("\"drain_items_per_s\":{:.0}", rate(n, d)));
                    fields.push(format!("\"drain_items\":{n}"));
                    fields.push(format!("\"dequeue_ack_latency\":{}", lat.summary()));
                }
                "mixed" => {
                    let producing = Arc::new(AtomicBool::new(true));
                    let deadline = Instant::now() + limit;
                    let consumer = {
                        let me = me.clone();
                        let producing = producing.clone();
                        let items = args.items;
                        tokio::spawn(async move { me.consume(items, deadline, producing).await })
                    };
                    let produced = me.produce(args.items, deadline).await;
                    producing.store(false, Ordering::SeqCst);
                    let (d, lat, n) = consumer.await??;
                    let (_, plat) = produced?;
                    fields.push(format!("\"mixed_items_per_s\":{:.0}", rate(n, d)));
                    fields.push(format!("\"mixed_items\":{n}"));
                    fields.push(format!("\"mixed_enqueue_latency\":{}", plat.summary()));
                    fields.push(format!("\"mixed_dequeue_ack_latency\":{}", lat.summary()));
                }
                other => anyhow::bail!("unknown phase {other:?}: want enqueue, drain or mixed"),
            }
        }
        ch.queue_delete(me.queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        let _ = conn.close(200, "done".into()).await;
        anyhow::Ok(())
    })
}
