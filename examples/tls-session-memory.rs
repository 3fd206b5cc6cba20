//! What an idle TLS connection's state costs on the server, by part:
//! rustls' buffered `ServerConnection` against the `UnbufferedServerConnection`
//! switchboard uses (src/tls.rs), for each TLS 1.3 cipher suite and for
//! TLS 1.2.
//!
//! `cargo run --release --example tls-session-memory -- CERT KEY [N]`
//!
//! Each of N server connections completes a handshake with a client in this
//! process (bytes passed in memory, no sockets), then carries one request
//! and one response of a stream's size, as an idle stream has; the clients
//! are dropped. A counting allocator gives the heap still held per server
//! connection; its inline size (what the stream's box holds) is added. For
//! TLS 1.3 a third row: the two expanded AEAD keys alone (rustls' encrypter
//! and decrypter rebuilt from the secrets `dangerous_into_kernel_connection`
//! hands over), which is what switchboard's `tls::Records` keeps for an
//! AES-128-GCM stream; for AES-256-GCM and ChaCha20-Poly1305 it keeps the
//! 2 x 44 bytes of secrets instead and expands them per write.
//! The heap figure is the allocator's requested bytes; mimalloc rounds each
//! block up to its size class, which the RSS figures in BENCHMARKS.md
//! include.

// A counting allocator is an `unsafe impl GlobalAlloc`; it only forwards.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, UnbufferedStatus};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

/// Live heap bytes.
static LIVE: AtomicIsize = AtomicIsize::new(0);

struct Counting;

// SAFETY: forwards to the system allocator, counting what it hands out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const REQUEST: &[u8] = b"GET /test/idle HTTP/1.1\r\nhost: example\r\n\r\n";
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n28\r\nSwitchboard welcomes you! Your Id: idle\n\r\n";

/// A buffered server connection after a handshake, a request and a
/// response.
fn buffered(server: &Arc<ServerConfig>, client: &Arc<ClientConfig>) -> ServerConnection {
    let mut s = ServerConnection::new(Arc::clone(server)).unwrap();
    let mut c =
        ClientConnection::new(Arc::clone(client), ServerName::try_from("localhost").unwrap()).unwrap();
    c.writer().write_all(REQUEST).unwrap();
    let (mut got, mut answered) = (Vec::new(), false);
    while got.len() < RESPONSE.len() {
        let mut wire = Vec::new();
        c.write_tls(&mut wire).unwrap();
        s.read_tls(&mut &wire[..]).unwrap();
        s.process_new_packets().unwrap();
        let mut req = [0u8; 256];
        if !answered && s.reader().read(&mut req).is_ok_and(|n| n > 0) {
            s.writer().write_all(RESPONSE).unwrap();
            answered = true;
        }
        let mut wire = Vec::new();
        s.write_tls(&mut wire).unwrap();
        c.read_tls(&mut &wire[..]).unwrap();
        c.process_new_packets().unwrap();
        let mut buf = [0u8; 256];
        if let Ok(n) = c.reader().read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
    }
    s
}

/// Appends what `write` puts in a buffer to `out`.
fn append(out: &mut Vec<u8>, write: impl FnOnce(&mut [u8]) -> usize) {
    let start = out.len();
    out.resize(start + 16_384, 0);
    let n = write(&mut out[start..]);
    out.truncate(start + n);
}

/// The same with the unbuffered connection, driven as src/tls.rs drives
/// it (incoming bytes in a vector freed when empty).
fn unbuffered(server: &Arc<ServerConfig>, client: &Arc<ClientConfig>) -> UnbufferedServerConnection {
    let mut s = UnbufferedServerConnection::new(Arc::clone(server)).unwrap();
    let mut c =
        ClientConnection::new(Arc::clone(client), ServerName::try_from("localhost").unwrap()).unwrap();
    c.writer().write_all(REQUEST).unwrap();
    let (mut incoming, mut request, mut got, mut answered) = (Vec::new(), Vec::new(), Vec::new(), false);
    for _ in 0..20 {
        if got.len() >= RESPONSE.len() {
            return s;
        }
        c.write_tls(&mut incoming).unwrap();
        let mut to_client = Vec::new();
        loop {
            let UnbufferedStatus { mut discard, state } = s.process_tls_records(&mut incoming);
            let mut stop = false;
            match state.unwrap() {
                ConnectionState::ReadTraffic(mut r) => {
                    while let Some(rec) = r.next_record() {
                        let rec = rec.unwrap();
                        discard += rec.discard;
                        request.extend_from_slice(rec.payload);
                    }
                }
                ConnectionState::EncodeTlsData(mut e) => append(&mut to_client, |b| e.encode(b).unwrap()),
                ConnectionState::TransmitTlsData(t) => t.done(),
                ConnectionState::BlockedHandshake => stop = true,
                ConnectionState::WriteTraffic(mut w) => {
                    if !answered && request.len() >= REQUEST.len() {
                        append(&mut to_client, |b| w.encrypt(RESPONSE, b).unwrap());
                        answered = true;
                    }
                    stop = true;
                }
                other => panic!("{other:?}"),
            }
            incoming.drain(..discard);
            if stop {
                break;
            }
        }
        if incoming.is_empty() {
            incoming = Vec::new();
        }
        c.read_tls(&mut &to_client[..]).unwrap();
        c.process_new_packets().unwrap();
        let mut buf = [0u8; 256];
        if let Ok(n) = c.reader().read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
    }
    panic!("no response after 20 rounds");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (cert, key) = (&args[1], &args[2]);
    let n: usize = args.get(3).map_or(1000, |a| a.parse().unwrap());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let mut roots = RootCertStore::empty();
    // The test certificates are signed by an authority next to them
    // (tests/common make_certificates: NAME.crt and NAME-ca.pem).
    let ca = cert.replace(".crt", "-ca.pem");
    for c in CertificateDer::pem_file_iter(&ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    println!(
        "inline: ServerConnection {} B, UnbufferedServerConnection {} B",
        size_of::<ServerConnection>(),
        size_of::<UnbufferedServerConnection>()
    );
    println!("| connection | protocol, cipher suite | heap B per idle connection | + inline B | total B |");
    println!("|---|---|---:|---:|---:|");
    let ring = rustls::crypto::ring::default_provider();
    let mut suites: Vec<(String, CryptoProvider, &'static rustls::SupportedProtocolVersion)> = Vec::new();
    for suite in &ring.cipher_suites {
        // The test certificate is ECDSA: no TLS 1.2 RSA suite applies.
        if format!("{:?}", suite.suite()).contains("_RSA_") {
            continue;
        }
        let version = match suite.version().version {
            rustls::ProtocolVersion::TLSv1_3 => &rustls::version::TLS13,
            _ => &rustls::version::TLS12,
        };
        let provider = CryptoProvider {
            cipher_suites: vec![*suite],
            ..rustls::crypto::ring::default_provider()
        };
        suites.push((format!("{:?}", suite.suite()), provider, version));
    }
    for (name, provider, version) in suites {
        let provider = Arc::new(provider);
        let mut server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[version])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain.clone(), key.clone_key())
            .unwrap();
        server.enable_secret_extraction = true;
        let server = Arc::new(server);
        let client = Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[version])
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth(),
        );
        // Warm up: the session cache, lazily built tables.
        drop(buffered(&server, &client));
        drop(unbuffered(&server, &client));
        let before = LIVE.load(Relaxed);
        let held: Vec<ServerConnection> = (0..n).map(|_| buffered(&server, &client)).collect();
        let heap = (LIVE.load(Relaxed) - before) as usize / n - size_of::<ServerConnection>();
        let inline = size_of::<ServerConnection>();
        println!("| buffered | {name} | {heap} | {inline} | {} |", heap + inline);
        drop(held);
        let before = LIVE.load(Relaxed);
        let held: Vec<UnbufferedServerConnection> = (0..n).map(|_| unbuffered(&server, &client)).collect();
        let heap = (LIVE.load(Relaxed) - before) as usize / n - size_of::<UnbufferedServerConnection>();
        let inline = size_of::<UnbufferedServerConnection>();
        println!("| unbuffered | {name} | {heap} | {inline} | {} |", heap + inline);
        drop(held);
        if *version == rustls::version::TLS13 {
            type Keys = (
                Box<dyn rustls::crypto::cipher::MessageEncrypter>,
                Box<dyn rustls::crypto::cipher::MessageDecrypter>,
            );
            let before = LIVE.load(Relaxed);
            let conns: Vec<UnbufferedServerConnection> =
                (0..n).map(|_| unbuffered(&server, &client)).collect();
            let keys: Vec<Keys> = conns
                .into_iter()
                .map(|c| {
                    let Some(rustls::SupportedCipherSuite::Tls13(suite)) = c.negotiated_cipher_suite() else {
                        panic!("TLS 1.3")
                    };
                    let (secrets, _) = c.dangerous_into_kernel_connection().unwrap();
                    let split = |s: rustls::ConnectionTrafficSecrets| match s {
                        rustls::ConnectionTrafficSecrets::Aes128Gcm { key, iv }
                        | rustls::ConnectionTrafficSecrets::Aes256Gcm { key, iv }
                        | rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (key, iv),
                        _ => panic!("suite"),
                    };
                    let ((tk, ti), (rk, ri)) = (split(secrets.tx.1), split(secrets.rx.1));
                    (suite.aead_alg.encrypter(tk, ti), suite.aead_alg.decrypter(rk, ri))
                })
                .collect();
            // The connections are gone: what is left is the keys (and the
            // vector of them, taken out).
            let heap = (LIVE.load(Relaxed) - before) as usize / n - size_of::<Keys>();
            println!("| expanded keys only | {name} | {heap} | 32 | {} |", heap + 32);
            drop(keys);
        }
    }
}
