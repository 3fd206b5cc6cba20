//! Message mode: POSTs `--msg-rate` messages per second to random streams this
//! process holds. Each body is `@<send time in µs>`; the receiving stream
//! reads the stamp back and records the latency. An `https://` send URL is
//! posted to over TLS, with the streams' configuration.

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::Plan;
use super::conn::now_micros;
use super::report::Counters;
use crate::http;
use crate::target::{Target, id_of};
use crate::tls::{self, Io};

/// Keep-alive connections messages are spread over.
const SENDERS: usize = 4;

/// Sending stops this long before the run ends, so the last messages arrive.
pub(super) const DRAIN: Duration = Duration::from_secs(1);

/// Random picks tried to find an open stream before skipping a message.
const PICK_TRIES: usize = 16;

/// Waits until every stream of this process has connected or failed (or the
/// opening should long be over), then paces messages until `deadline - DRAIN`.
/// Starting only once the streams are open keeps connection set-up out of
/// the latency figures.
pub(super) async fn run(plan: Rc<Plan>, counters: Rc<Counters>, deadline: Instant) {
    let opening = Duration::from_secs_f64(plan.count as f64 / plan.rate) + plan.connect_timeout;
    let open_by = Instant::now() + opening;
    while counters.settled() < plan.count && Instant::now() < open_by.min(deadline) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // unwrap: only spawned when messages are on.
    let send = plan.send.clone().expect("message target");
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (tx, rx) = mpsc::unbounded_channel::<(usize, String)>();
            let tls = if send.tls { plan.tls.clone() } else { None };
            let handle = tokio::task::spawn_local(send_loop(send.clone(), tls, rx, Rc::clone(&counters)));
            (tx, handle)
        })
        .collect();
    let started = Instant::now();
    let stop_at = deadline.checked_sub(DRAIN).unwrap_or(deadline);
    let mut rng = SmallRng::seed_from_u64(plan.first_n ^ now_micros());
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut queued = 0u64;
    while Instant::now() < stop_at {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * plan.msg_rate) as u64;
        while queued < due {
            queued += 1;
            let pick = (0..PICK_TRIES)
                .map(|_| rng.random_range(0..plan.count))
                .find(|&i| counters.is_open(i as usize));
            let Some(i) = pick else { continue };
            let (_, path, _) = plan.conn(plan.first_n + i);
            let target = send.path.replace("{id}", id_of(&path));
            let _ = senders[(queued as usize) % SENDERS].0.send((i as usize, target));
        }
    }
    for (tx, handle) in senders {
        drop(tx);
        let _ = handle.await;
    }
}

/// The `"delivered": n` of a JSON answer, 0 without one.
fn delivered_count(body: &[u8]) -> u64 {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["delivered"].as_u64())
        .unwrap_or(0)
}

/// One keep-alive connection sending what it is given, reconnecting once on
/// failure; over TLS with `tls` (the target is `https://`).
async fn send_loop(
    target: Target,
    tls: Option<Arc<ClientConfig>>,
    mut rx: mpsc::UnboundedReceiver<(usize, String)>,
    counters: Rc<Counters>,
) {
    let addr = target.addr;
    let mut conn: Option<Box<dyn Io>> = None;
    let mut buf = Vec::new();
    while let Some((stream, path)) = rx.recv().await {
        // Picked while its stream was open, but queued behind other sends:
        // on a loaded machine the stream may since have left (`--lifetime`)
        // and closed, and a message sent now would be counted as expected
        // by a stream that can no longer get it. Not sent, not counted.
        if !counters.is_open(stream) {
            continue;
        }
        let (mut ok, mut partial, mut stamp) = (false, 0, 0);
        for _ in 0..2 {
            if conn.is_none() {
                conn = tls::connect(addr, &target.host, tls.as_ref()).await.ok();
                buf.clear();
            }
            let Some(c) = conn.as_mut() else { break };
            match post(c, &mut buf, addr, &path).await {
                Ok((status, delivered, sent_us)) => {
                    ok = (200..300).contains(&status);
                    stamp = sent_us;
                    partial = if ok { 0 } else { delivered };
                    break;
                }
                Err(_) => conn = None,
            }
        }
        if ok {
            counters.message_sent(stamp);
        } else {
            counters.send_errors.set(counters.send_errors.get() + 1);
        }
        counters.partial.set(counters.partial.get() + partial);
    }
}

/// Sends one stamped message and reads the answer; returns its status, the
/// answer's `"delivered"` count (0 if it has none) and the stamp. A switchboard node
/// whose cluster bus is down answers 503 with the streams it delivered to
/// itself: those messages arrive, and are expected.
async fn post(
    c: &mut Box<dyn Io>,
    buf: &mut Vec<u8>,
    addr: SocketAddr,
    path: &str,
) -> io::Result<(u16, u64, u64)> {
    let stamp = now_micros();
    let body = format!("@{stamp}");
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await?;
    c.flush().await?;
    loop {
        match http::parse_response(buf) {
            Ok(Some(r)) => {
                let delivered = delivered_count(r.body(buf));
                buf.drain(..r.len);
                return Ok((r.status, delivered, stamp));
            }
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
        if c.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::delivered_count;

    #[test]
    fn partial_deliveries_are_read_from_the_answer() {
        assert_eq!(
            delivered_count(br#"{"error":"cluster bus unavailable","delivered":3}"#),
            3
        );
        assert_eq!(delivered_count(br#"{"error":"stream limit"}"#), 0);
        assert_eq!(delivered_count(b"not json"), 0);
    }
}
