//! `bench-floor`: the least any server can do to hand one line to every
//! held stream on this box, for `bench broadcast` to measure beside
//! switchboard and Nchan in the same run.
//!
//! It answers every `GET` with a chunked `200` and keeps the socket; a
//! `POST` (any path) writes its body as one chunk to every socket it holds,
//! from `--writers` threads (one per core by default, as switchboard's
//! workers and nginx's `worker_processes 2`), each writing its share in a
//! tight loop: one `write(2)` per stream and nothing else. No routing, no
//! ticks, no per-stream state, no event loop: what is left is the kernel's
//! cost of a loopback TCP segment (the receiver's half of the stack runs in
//! the sender's system call) and the reader's. That is the floor of the
//! one-write-per-stream design on this machine.
//!
//! With `--uring BATCH`, each writer submits its sends through io_uring,
//! BATCH at a time (one `io_uring_enter` per batch instead of one `write`
//! per stream), which measures whether batched submission beats the
//! system-call floor.
//!
//! It binds `--port` (0: a free one) on 127.0.0.1 and prints
//! `listening on 127.0.0.1:PORT` as its first line. Its answers are
//! `Connection: close`. This is a measuring tool, not a server: it reads
//! one request at a time on one thread.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;

/// Largest request head read.
const MAX_HEAD: usize = 8192;

/// Largest request body read.
const MAX_BODY: usize = 64 * 1024;

/// The floor of handing one line to every held stream.
#[derive(Parser, Debug)]
#[command(name = "bench-floor")]
struct Args {
    /// Port on 127.0.0.1 (0: a free one; the first line printed says which).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Writer threads [default: one per core].
    #[arg(long)]
    writers: Option<usize>,
    /// Submit the writes through io_uring, this many per submission.
    #[arg(long, value_name = "BATCH")]
    uring: Option<usize>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let writers = args
        .writers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
        .max(1);
    if args.uring == Some(0) {
        bail!("--uring takes a batch of 1 or more");
    }
    // One descriptor per stream: the soft limit goes up to the hard one,
    // as switchboard's and floodtest's do.
    if let Ok((_, hard)) = rlimit::Resource::NOFILE.get() {
        let _ = rlimit::Resource::NOFILE.set(hard, hard);
    }
    let listener = TcpListener::bind(("127.0.0.1", args.port)).context("bind")?;
    println!("listening on {}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let mut held: Vec<TcpStream> = Vec::new();
    for conn in listener.incoming() {
        let Ok(mut s) = conn else {
            // Out of descriptors (or another accept error): not a spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        // A client that stops reading cannot hold a fan-out for long.
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let _ = s.set_nodelay(true);
        let Some((head, rest)) = read_head(&mut s) else {
            continue;
        };
        let line = head.lines().next().unwrap_or_default();
        if line.starts_with("GET /healthz ") {
            answer(&mut s, "ok");
        } else if line.starts_with("GET ") {
            let open = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n";
            if s.write_all(open).is_ok() {
                held.push(s);
            }
        } else if line.starts_with("POST ") {
            let Some(body) = read_body(&mut s, &head, rest) else {
                continue;
            };
            let text = String::from_utf8_lossy(&body);
            let text = text.trim_end();
            let chunk = format!("{:x}\r\n{text}\n\r\n", text.len() + 1).into_bytes();
            let started = Instant::now();
            let written = fan_out(&held, &chunk, writers, args.uring);
            eprintln!(
                "bench-floor: wrote {written} of {} in {:?} ({writers} writers{})",
                held.len(),
                started.elapsed(),
                args.uring
                    .map_or(String::new(), |b| format!(", io_uring batches of {b}"))
            );
            answer(&mut s, &format!("{{\"delivered\": {written}}}"));
        } else {
            let _ =
                s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    }
    Ok(())
}

/// Reads a request head; returns it and whatever came after it.
fn read_head(s: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(512);
    let mut b = [0u8; 2048];
    loop {
        let n = s.read(&mut b).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&b[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..at]).into_owned();
            return Some((head, buf[at + 4..].to_vec()));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// Reads the body `head`'s Content-Length announces (`rest` came with the
/// head).
fn read_body(s: &mut TcpStream, head: &str, mut body: Vec<u8>) -> Option<Vec<u8>> {
    let len: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())?;
    if len > MAX_BODY {
        return None;
    }
    let mut b = [0u8; 2048];
    while body.len() < len {
        let n = s.read(&mut b).ok().filter(|&n| n > 0)?;
        body.extend_from_slice(&b[..n]);
    }
    body.truncate(len);
    Some(body)
}

/// A `200` with `body`, and the connection closed.
fn answer(s: &mut TcpStream, body: &str) {
    let _ = write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Writes `chunk` to every socket of `held`, split over `writers` threads;
/// returns how many took it whole.
fn fan_out(held: &[TcpStream], chunk: &[u8], writers: usize, uring: Option<usize>) -> usize {
    let share = held.len().div_ceil(writers).max(1);
    std::thread::scope(|scope| {
        let threads: Vec<_> = held
            .chunks(share)
            .map(|part| {
                scope.spawn(move || match uring {
                    Some(batch) => write_uring(part, chunk, batch),
                    None => write_each(part, chunk),
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or(0)).sum()
    })
}

/// One `write(2)` per socket (`Write for &TcpStream` is that call).
fn write_each(held: &[TcpStream], chunk: &[u8]) -> usize {
    held.iter()
        .filter(|s| {
            let mut s: &TcpStream = s;
            s.write(chunk).is_ok_and(|n| n == chunk.len())
        })
        .count()
}

/// The same sends through io_uring, `batch` per `io_uring_enter`.
#[allow(unsafe_code)] // Pushing a submission is unsafe: see the SAFETY note.
fn write_uring(held: &[TcpStream], chunk: &[u8], batch: usize) -> usize {
    use io_uring::{IoUring, opcode, types};
    let Ok(entries) = u32::try_from(batch.next_power_of_two()) else {
        return 0;
    };
    let Ok(mut ring) = IoUring::new(entries) else {
        eprintln!("bench-floor: io_uring is not available here");
        return 0;
    };
    let Ok(len) = u32::try_from(chunk.len()) else {
        return 0;
    };
    let mut whole = 0;
    for part in held.chunks(batch) {
        {
            let mut sq = ring.submission();
            for s in part {
                let send = opcode::Send::new(types::Fd(s.as_raw_fd()), chunk.as_ptr(), len).build();
                // SAFETY: the ring has room for `batch` entries and is
                // drained below before the next batch; `chunk` and the
                // sockets outlive every send (each is complete when reaped).
                if unsafe { sq.push(&send) }.is_err() {
                    break;
                }
            }
        }
        loop {
            match ring.submit_and_wait(part.len()) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Sends may still be in flight on `chunk`: end the
                    // process (which ends the ring) before it is freed.
                    eprintln!("bench-floor: io_uring submission failed: {e}");
                    std::process::exit(1);
                }
            }
        }
        whole += ring
            .completion()
            .filter(|c| u32::try_from(c.result()).is_ok_and(|n| n == len))
            .count();
    }
    whole
}
