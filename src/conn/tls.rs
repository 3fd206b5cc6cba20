//! https:// and wss:// served natively (`server.tls_cert_file`,
//! `server.tls_key_file`, `server.tls_ports`): this module owns every TLS
//! connection's session, the record layer an idle TLS 1.3 stream keeps,
//! and the certificate that SIGHUP reloads.
//!
//! Every TLS connection starts as a rustls [`UnbufferedServerConnection`]:
//! the buffered `ServerConnection` keeps a deframer buffer of at least 4 KiB
//! for its whole life once it has read anything (rustls 0.23's
//! `DeframerVecBuffer::prepare_read`). The ciphertext not yet decrypted and
//! the plaintext not yet taken live in this module's [`Session`], in vectors
//! that are empty, and unallocated, whenever nothing is in flight.
//!
//! A [`Session`] is driven from the socket by the async functions here
//! (the handshake, the request head), then by actix-web through [`TlsIo`],
//! or, for a lean stream, handed to its sink (`crate::stream::sink`) as a
//! [`Protection`]: a TLS 1.3 stream keeps only its traffic secrets
//! ([`Records`]), a TLS 1.2 stream the session. The
//! certificate is resolved per handshake from [`Certificates`], which SIGHUP
//! reloads: open connections keep their keys, new ones get the new
//! certificate.

use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, ready};

use actix_rt::net::TcpStream;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, UnbufferedServerConnection};
use rustls::sign::CertifiedKey;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, UnbufferedStatus};
use rustls::{ServerConfig, crypto::CryptoProvider};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, timeout_at};

use crate::conn::classify::{HeadError, HeadSource, Line, PEEK_BYTES};
use crate::conn::wire::{CLOSE_AFTER_ANSWER, Wire};
use crate::stats::Stats;

/// How much ciphertext one read takes from the socket: a whole TLS record
/// (16 KiB of plaintext and its overhead) in at most two reads. A stack
/// buffer, so it costs nothing between reads.
const READ_CHUNK: usize = 8 * 1024;

/// The certificate and key every new handshake is given; replaced by
/// [`Certificates::reload`].
#[derive(Debug)]
pub(crate) struct Certificates {
    cert_file: String,
    key_file: String,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

/// What a certificate or key file could not give, naming the key to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadError {
    /// `server.tls_cert_file` or `server.tls_key_file`.
    pub key: &'static str,
    /// Why, with the file's name.
    pub reason: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// The crypto provider: ring, as the Redis TLS already uses (one backend in
/// the binary). `ring` and `aws-lc-rs` both keep an AES-GCM key in about the
/// same space; see BENCHMARKS.md for what an idle TLS stream costs.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM certificate chain and private key, and checks that the key
/// is the certificate's.
pub(crate) fn load(
    cert_file: &str,
    key_file: &str,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, LoadError> {
    let cert_err = |reason: String| LoadError {
        key: "server.tls_cert_file",
        reason,
    };
    let key_err = |reason: String| LoadError {
        key: "server.tls_key_file",
        reason,
    };
    let pem = std::fs::read(cert_file).map_err(|e| cert_err(format!("cannot read {cert_file}: {e}")))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(format!("{cert_file} is not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(cert_err(format!("{cert_file} holds no certificate")));
    }
    let pem = std::fs::read(key_file).map_err(|e| key_err(format!("cannot read {key_file}: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| key_err(format!("{key_file} holds no PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => key_err(format!("{key_file} is not the key of {cert_file}")),
        e => key_err(format!("{key_file}: {e}")),
    })
}

impl Certificates {
    /// Loads the files; an error names the key to fix.
    pub(crate) fn load(cert_file: &str, key_file: &str) -> Result<Self, LoadError> {
        let provider = provider();
        let key = load(cert_file, key_file, &provider)?;
        Ok(Certificates {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            provider,
            current: RwLock::new(Arc::new(key)),
        })
    }

    /// Reads the files again; on an error the certificate in use stays.
    pub(crate) fn reload(&self) -> Result<(), LoadError> {
        let key = load(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(())
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|e| e.into_inner()),
        ))
    }
}

/// What every TLS port of a process accepts with.
pub(crate) struct Acceptor {
    config: Arc<ServerConfig>,
    certificates: Arc<Certificates>,
}

impl Acceptor {
    /// TLS 1.2 and 1.3, ALPN `http/1.1` and `http/1.0` (no HTTP/2 here), no client
    /// certificates.
    pub(crate) fn new(cert_file: &str, key_file: &str) -> Result<Self, LoadError> {
        let certificates = Arc::new(Certificates::load(cert_file, key_file)?);
        // TLS 1.3: AES-256-GCM and ChaCha20-Poly1305 before AES-128-GCM,
        // chosen in this order whatever the client prefers: their 32-byte
        // keys are what an idle stream keeps (`Key`). Every browser, curl,
        // Java 11+, Go and Erlang offer both.
        let mut provider = (*certificates.provider).clone();
        provider.cipher_suites.sort_by_key(|s| match s.suite() {
            rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 0,
            rustls::CipherSuite::TLS13_CHACHA20_POLY1305_SHA256 => 1,
            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 2,
            _ => 3,
        });
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| LoadError {
                key: "server.tls_cert_file",
                reason: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certificates) as Arc<dyn ResolvesServerCert>);
        // curl --http1.0 offers only "http/1.0".
        config.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
        // A TLS 1.3 stream keeps only its record keys (`Records`).
        config.enable_secret_extraction = true;
        config.ignore_client_order = true;
        Ok(Acceptor {
            config: Arc::new(config),
            certificates,
        })
    }

    /// A session for a connection just accepted.
    pub(crate) fn session(&self) -> Result<Session, rustls::Error> {
        Ok(Session {
            conn: UnbufferedServerConnection::new(Arc::clone(&self.config))?,
            incoming: Vec::new(),
            plain: Vec::new(),
            peer_closed: false,
            failed: false,
        })
    }

    /// Reads the certificate and key files again (SIGHUP).
    pub(crate) fn reload(&self) -> Result<(), LoadError> {
        self.certificates.reload()
    }
}

/// One TLS connection's state, without its socket.
pub(crate) struct Session {
    conn: UnbufferedServerConnection,
    /// Ciphertext read and not yet a whole record. Unallocated when empty.
    incoming: Vec<u8>,
    /// Plaintext decrypted and not yet taken. Unallocated when empty.
    pub(crate) plain: Vec<u8>,
    /// The client sent close_notify, or its socket reached EOF.
    pub(crate) peer_closed: bool,
    /// rustls reported an error. Its alert went out with that answer, and
    /// the connection is never fed again: after an error rustls may still
    /// track a half-assembled handshake message in the buffer it was given,
    /// and a call with any other buffer panics inside it (issue 40).
    failed: bool,
}

/// Appends what `write` puts in a buffer to `out`, growing it as asked.
fn append(
    out: &mut Vec<u8>,
    guess: usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, Grow>,
) -> Result<(), rustls::Error> {
    let start = out.len();
    out.resize(start + guess, 0);
    loop {
        match write(&mut out[start..]) {
            Ok(n) => {
                out.truncate(start + n);
                return Ok(());
            }
            Err(Grow::To(size)) => out.resize(start + size, 0),
            Err(Grow::Failed(e)) => {
                out.truncate(start);
                return Err(e);
            }
        }
    }
}

/// Why a write into a buffer did not happen.
enum Grow {
    /// The buffer must have this many bytes.
    To(usize),
    /// It cannot be written at all.
    Failed(rustls::Error),
}

impl From<EncodeError> for Grow {
    fn from(e: EncodeError) -> Self {
        match e {
            EncodeError::InsufficientSize(s) => Grow::To(s.required_size),
            e => Grow::Failed(rustls::Error::General(e.to_string())),
        }
    }
}

impl From<EncryptError> for Grow {
    fn from(e: EncryptError) -> Self {
        match e {
            EncryptError::InsufficientSize(s) => Grow::To(s.required_size),
            e => Grow::Failed(rustls::Error::General(e.to_string())),
        }
    }
}

/// Where [`Session::step`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The handshake needs more from the client.
    Handshaking,
    /// Application data may be sent.
    Traffic,
    /// Both sides sent close_notify.
    Closed,
}

impl Session {
    /// Processes what has been read: decrypted data goes to `plain`, what
    /// TLS itself must send (handshake flights, session tickets, key updates,
    /// alerts) to `out`; with `send`, `send`'s bytes are encrypted after it
    /// (and a close_notify with `close`). Stops where only the client can
    /// move the connection on.
    ///
    /// After an error, every later call answers [`rustls::Error::General`]
    /// without calling rustls again (see `failed`).
    fn step(&mut self, out: &mut Vec<u8>, send: Option<(&[u8], bool)>) -> Result<Stop, rustls::Error> {
        if self.failed {
            return Err(rustls::Error::General("TLS connection failed earlier".into()));
        }
        self.step_records(out, send).inspect_err(|_| {
            self.alerts(out);
            self.failed = true;
            self.incoming = Vec::new();
        })
    }

    /// [`Session::step`] on a session that has not failed. On an error,
    /// what rustls asked to discard is discarded first, so `incoming` is
    /// still the buffer rustls tracks when [`Session::alerts`] runs.
    fn step_records(
        &mut self,
        out: &mut Vec<u8>,
        send: Option<(&[u8], bool)>,
    ) -> Result<Stop, rustls::Error> {
        loop {
            let UnbufferedStatus { mut discard, state } = self.conn.process_tls_records(&mut self.incoming);
            // Every way out of this block discards what rustls asked to,
            // an error included.
            let stop = match state {
                Err(e) => Err(e),
                Ok(ConnectionState::ReadTraffic(mut records)) => loop {
                    match records.next_record() {
                        None => break Ok(None),
                        Some(Ok(record)) => {
                            discard += record.discard;
                            self.plain.extend_from_slice(record.payload);
                        }
                        Some(Err(e)) => break Err(e),
                    }
                },
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    append(out, 4096, |buf| Ok(data.encode(buf)?)).map(|()| None)
                }
                // What was encoded goes out with `out`, before anything
                // encrypted after it.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    Ok(None)
                }
                Ok(ConnectionState::PeerClosed) => {
                    self.peer_closed = true;
                    Ok(None)
                }
                Ok(ConnectionState::BlockedHandshake) => Ok(Some(Stop::Handshaking)),
                Ok(ConnectionState::Closed) => Ok(Some(Stop::Closed)),
                Ok(ConnectionState::WriteTraffic(mut traffic)) => (|| {
                    if let Some((data, close)) = send {
                        if !data.is_empty() {
                            // A record's overhead is at most 22 bytes, per
                            // 16 KiB of data.
                            append(out, data.len() + 64 + data.len() / 512, |buf| {
                                Ok(traffic.encrypt(data, buf)?)
                            })?;
                        }
                        if close {
                            append(out, 64, |buf| Ok(traffic.queue_close_notify(buf)?))?;
                        }
                    }
                    Ok(Some(Stop::Traffic))
                })(),
                // Early data is off (the default), so never offered.
                Ok(_) => Err(rustls::Error::General("unexpected TLS state".into())),
            };
            self.incoming.drain(..discard);
            if let Some(stop) = stop? {
                if self.incoming.is_empty() {
                    self.incoming = Vec::new();
                }
                return Ok(stop);
            }
        }
    }

    /// After an error: what rustls queued before it (the rest of a
    /// flight, such as the ServerHello) and the alert it queued for it (a
    /// failed handshake's reason, `bad_record_mac`), so the client learns
    /// why.
    ///
    /// rustls is given the buffer it has been tracking (`incoming`): an
    /// empty one in its place made it index past the end of a half-read
    /// handshake message and panic (issue 40). It stops at the alert,
    /// the last thing queued: one call more would parse the bad bytes
    /// again and queue a second fatal alert. An alert record is type 21,
    /// or 23 once TLS 1.3 encrypts; a flight's records before it are 20
    /// or 22.
    fn alerts(&mut self, out: &mut Vec<u8>) {
        for _ in 0..4 {
            let start = out.len();
            let UnbufferedStatus { discard, state } = self.conn.process_tls_records(&mut self.incoming);
            let encoded = match state {
                Ok(ConnectionState::EncodeTlsData(mut data)) => append(out, 64, |buf| Ok(data.encode(buf)?)),
                _ => return,
            };
            self.incoming.drain(..discard);
            if encoded.is_err() || !matches!(out.get(start), Some(20 | 22)) {
                return;
            }
        }
    }

    /// Takes `bytes` read from the socket; TLS's own output goes to `out`.
    pub(crate) fn received(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        if !self.failed {
            self.incoming.extend_from_slice(bytes);
        }
        self.step(out, None).map(drop)
    }

    /// Encrypts `data` into `out` (after anything TLS must send first); with
    /// `close`, a close_notify after it.
    pub(crate) fn encrypt(
        &mut self,
        data: &[u8],
        close: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), rustls::Error> {
        match self.step(out, Some((data, close)))? {
            Stop::Traffic => Ok(()),
            Stop::Handshaking => Err(rustls::Error::HandshakeNotComplete),
            Stop::Closed => Err(rustls::Error::General("connection closed".into())),
        }
    }

    /// Moves up to `buf.len()` bytes of decrypted data into `buf`.
    pub(crate) fn take_plain(&mut self, buf: &mut [u8]) -> usize {
        take(&mut self.plain, buf)
    }

    /// Reads once from `io` (waiting until `deadline`) and processes it.
    async fn read_once(&mut self, io: &TcpStream, deadline: Instant) -> Result<(), HeadError> {
        let mut out = Vec::new();
        let stepped = loop {
            match timeout_at(deadline, io.readable()).await {
                Err(_) => return Err(HeadError::Timeout),
                Ok(Err(_)) => return Err(HeadError::Gone),
                Ok(Ok(())) => {}
            }
            // The buffer lives in this block, never across an await: in the
            // future it would cost every TLS connection actix-web serves
            // 8 KiB for its whole life.
            let mut buf = [0u8; READ_CHUNK];
            match io.try_read(&mut buf) {
                Ok(0) => return Err(HeadError::Gone),
                Ok(n) => break self.received(&buf[..n], &mut out),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(HeadError::Gone),
            }
        };
        if !out.is_empty() {
            // An alert for a bad record goes out too.
            let _ = timeout_at(deadline, crate::conn::wire::write_all(io, &out)).await;
        }
        stepped.map_err(|e| HeadError::Tls(tls_reason(&e)))
    }

    /// Completes the handshake over `io` by `deadline`.
    pub(crate) async fn handshake(&mut self, io: &TcpStream, deadline: Instant) -> Result<(), HeadError> {
        loop {
            let mut out = Vec::new();
            let stop = self.step(&mut out, None);
            if !out.is_empty() {
                match timeout_at(deadline, crate::conn::wire::write_all(io, &out)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(HeadError::Gone),
                    Err(_) => return Err(HeadError::Timeout),
                }
            }
            match stop.map_err(|e| HeadError::Tls(tls_reason(&e)))? {
                Stop::Traffic => return Ok(()),
                Stop::Closed => return Err(HeadError::Gone),
                Stop::Handshaking => self.read_once(io, deadline).await?,
            }
        }
    }

    /// Reads until more plaintext has arrived, by `deadline`.
    pub(crate) async fn read_plain(&mut self, io: &TcpStream, deadline: Instant) -> Result<(), HeadError> {
        let plain_before = self.plain.len();
        while self.plain.len() == plain_before {
            if self.peer_closed {
                return Err(HeadError::Gone);
            }
            self.read_once(io, deadline).await?;
        }
        Ok(())
    }

    /// Writes `data` and a close_notify, best effort (within `deadline`).
    pub(crate) async fn write_and_close(&mut self, io: &TcpStream, data: &[u8], deadline: Instant) {
        let mut out = Vec::new();
        if self.encrypt(data, true, &mut out).is_ok() {
            let _ = timeout_at(deadline, crate::conn::wire::write_all(io, &out)).await;
        }
    }
}

/// The largest plaintext in one record (RFC 8446 §5.1).
const MAX_FRAGMENT: usize = 16_384;

/// The largest ciphertext a TLS 1.3 record may carry (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_FRAGMENT + 256;

/// A TLS 1.3 stream's record protection once its head is read: rustls' own
/// AEAD encrypter and decrypter for the negotiated suite (ring), rebuilt
/// from the traffic secrets rustls hands over for kTLS
/// (`dangerous_into_kernel_connection`), and nothing of the connection
/// object.
///
/// Hand-written on purpose: keeping rustls' connection would cost an idle
/// stream nearly three times the rest of the stream, mostly the two
/// expanded keys; this keeps the two secrets ([`Key`]) (see
/// docs/design-notes.md, section "TLS streams").
/// What is written here is the 5-byte record framing and what a record
/// after the handshake means: data is data, an alert ends the stream,
/// anything else (a client's KeyUpdate, which browsers do not send) ends
/// it too, and the client reconnects with a full handshake. Past the suite's confidentiality limit
/// (2^23 records for AES-GCM) the stream ends likewise, since rekeying would
/// need the key schedule this drops.
pub(crate) struct Records {
    suite: &'static rustls::Tls13CipherSuite,
    tx: Key<dyn rustls::crypto::cipher::MessageEncrypter>,
    rx: Key<dyn rustls::crypto::cipher::MessageDecrypter>,
    tx_seq: u64,
    rx_seq: u64,
    /// Records that may be sent under this key.
    limit: u64,
    /// Ciphertext read and not yet a whole record. Unallocated when empty.
    incoming: Vec<u8>,
    /// Plaintext decrypted and not yet taken. Unallocated when empty.
    plain: Vec<u8>,
    /// The client sent an alert (close_notify, or an error) or EOF.
    peer_closed: bool,
}

/// One direction's key. A 32-byte key (AES-256-GCM, ChaCha20-Poly1305) is
/// kept as the secret and expanded for each batch of records: an expanded
/// key is several times the secret's size and an idle stream would keep
/// two, while expanding costs each write a little CPU (see
/// docs/design-notes.md, section "TLS streams"). A 16-byte key
/// (AES-128-GCM) is kept expanded, because
/// rustls' public API cannot build one back from its bytes; the server
/// prefers the other suites (`Acceptor::new`).
enum Key<T: ?Sized> {
    Secret([u8; 32], [u8; 12]),
    Expanded(Box<T>),
}

impl<T: ?Sized> Drop for Key<T> {
    fn drop(&mut self) {
        use zeroize::Zeroize as _;
        if let Key::Secret(key, iv) = self {
            key.zeroize();
            iv.zeroize();
        }
    }
}

/// A stream's TLS: the compact TLS 1.3 record layer, or (TLS 1.2, whose
/// secrets are not handed over here) the whole session.
pub(crate) enum Protection {
    Records(Records),
    Session(Box<Session>),
    /// Keys that could not be handed over: the stream ends at once.
    Gone,
}

impl Protection {
    /// What a lean stream keeps of `session` (its head read, nothing left
    /// to send).
    pub(crate) fn of(mut session: Session) -> Protection {
        use rustls::SupportedCipherSuite::Tls13;
        let Some(Tls13(suite)) = session.conn.negotiated_cipher_suite() else {
            return Protection::Session(Box::new(session));
        };
        let incoming = std::mem::take(&mut session.incoming);
        let plain = std::mem::take(&mut session.plain);
        let peer_closed = session.peer_closed;
        let secrets = match session.conn.dangerous_into_kernel_connection() {
            Ok((secrets, _)) => secrets,
            // Not reached for a session whose head was read (its handshake
            // is over and its flights were sent); a closed stream if it is.
            Err(e) => {
                tracing::warn!(event = "tls_failed", cause = %e, "TLS record keys not handed over");
                return Protection::Gone;
            }
        };
        let (Some((tx_key, tx_iv)), Some((rx_key, rx_iv))) =
            (key_and_iv(secrets.tx.1), key_and_iv(secrets.rx.1))
        else {
            return Protection::Gone;
        };
        let secret = |key: &rustls::crypto::cipher::AeadKey, iv: &rustls::crypto::cipher::Iv| {
            let mut nonce = [0u8; 12];
            nonce.copy_from_slice(iv.as_ref());
            <[u8; 32]>::try_from(key.as_ref()).ok().map(|k| (k, nonce))
        };
        let tx = match secret(&tx_key, &tx_iv) {
            Some((k, iv)) => Key::Secret(k, iv),
            None => Key::Expanded(suite.aead_alg.encrypter(tx_key, tx_iv)),
        };
        let rx = match secret(&rx_key, &rx_iv) {
            Some((k, iv)) => Key::Secret(k, iv),
            None => Key::Expanded(suite.aead_alg.decrypter(rx_key, rx_iv)),
        };
        Protection::Records(Records {
            suite,
            tx,
            rx,
            tx_seq: secrets.tx.0,
            rx_seq: secrets.rx.0,
            limit: suite.common.confidentiality_limit,
            incoming: if incoming.is_empty() { Vec::new() } else { incoming },
            plain: if plain.is_empty() { Vec::new() } else { plain },
            peer_closed,
        })
    }

    pub(crate) fn has_plain(&self) -> bool {
        match self {
            Protection::Records(r) => !r.plain.is_empty(),
            Protection::Session(s) => !s.plain.is_empty(),
            Protection::Gone => false,
        }
    }

    pub(crate) fn peer_closed(&self) -> bool {
        match self {
            Protection::Records(r) => r.peer_closed,
            Protection::Session(s) => s.peer_closed,
            Protection::Gone => true,
        }
    }

    /// Moves up to `buf.len()` bytes of decrypted data into `buf`.
    pub(crate) fn take_plain(&mut self, buf: &mut [u8]) -> usize {
        match self {
            Protection::Records(r) => take(&mut r.plain, buf),
            Protection::Session(s) => s.take_plain(buf),
            Protection::Gone => 0,
        }
    }

    /// Takes `bytes` read from the socket; what TLS must answer goes to
    /// `out`. An error ends the stream.
    pub(crate) fn received(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        match self {
            Protection::Records(r) => r.received(bytes),
            Protection::Session(s) => s.received(bytes, out),
            Protection::Gone => Err(rustls::Error::EncryptError),
        }
    }

    /// Encrypts `data` (and with `close`, a close_notify after it) into
    /// `out`.
    pub(crate) fn encrypt(
        &mut self,
        data: &[u8],
        close: bool,
        out: &mut Vec<u8>,
    ) -> Result<(), rustls::Error> {
        match self {
            Protection::Records(r) => r.seal(data, close, out),
            Protection::Session(s) => s.encrypt(data, close, out),
            Protection::Gone => Err(rustls::Error::EncryptError),
        }
    }
}

/// The key and IV of a TLS 1.3 suite's traffic secret.
fn key_and_iv(
    secrets: rustls::ConnectionTrafficSecrets,
) -> Option<(rustls::crypto::cipher::AeadKey, rustls::crypto::cipher::Iv)> {
    use rustls::ConnectionTrafficSecrets::{Aes128Gcm, Aes256Gcm, Chacha20Poly1305};
    match secrets {
        Aes128Gcm { key, iv } | Aes256Gcm { key, iv } | Chacha20Poly1305 { key, iv } => Some((key, iv)),
        // A suite rustls adds later: not known here.
        _ => None,
    }
}

impl Records {
    /// Encrypts `data` in records of at most 16 KiB, and a close_notify
    /// with `close`.
    fn seal(&mut self, data: &[u8], close: bool, out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        let mut expanded;
        let encrypter: &mut dyn rustls::crypto::cipher::MessageEncrypter = match &mut self.tx {
            Key::Secret(key, iv) => {
                expanded = self
                    .suite
                    .aead_alg
                    .encrypter((*key).into(), rustls::crypto::cipher::Iv::new(*iv));
                &mut *expanded
            }
            Key::Expanded(e) => &mut **e,
        };
        // Alert level warning (1), description close_notify (0).
        let close_notify: &[u8] = &[1, 0];
        let records = data
            .chunks(MAX_FRAGMENT)
            .map(|chunk| (rustls::ContentType::ApplicationData, chunk))
            .chain(close.then_some((rustls::ContentType::Alert, close_notify)));
        for (typ, chunk) in records {
            if self.tx_seq >= self.limit {
                return Err(rustls::Error::EncryptError);
            }
            let message = rustls::crypto::cipher::OutboundPlainMessage {
                typ,
                version: rustls::ProtocolVersion::TLSv1_2,
                payload: rustls::crypto::cipher::OutboundChunks::Single(chunk),
            };
            let sealed = encrypter.encrypt(message, self.tx_seq)?;
            self.tx_seq += 1;
            out.extend_from_slice(&sealed.encode());
        }
        Ok(())
    }

    /// Decrypts every whole record in what has arrived.
    fn received(&mut self, bytes: &[u8]) -> Result<(), rustls::Error> {
        if self.incoming.is_empty() && bytes.len() >= 5 {
            // A record arriving in pieces: room for exactly it, not a
            // doubling vector's up to twice as much.
            let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
            self.incoming
                .reserve_exact((5 + len.min(MAX_CIPHERTEXT)).max(bytes.len()));
        }
        self.incoming.extend_from_slice(bytes);
        let mut expanded = None;
        let mut at = 0;
        let result = loop {
            let rest = &mut self.incoming[at..];
            if rest.len() < 5 || self.peer_closed {
                break Ok(());
            }
            let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
            if len > MAX_CIPHERTEXT {
                break Err(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::MessageTooLarge,
                ));
            }
            if rest.len() < 5 + len {
                break Ok(());
            }
            let (head, body) = rest.split_at_mut(5);
            let message = rustls::crypto::cipher::InboundOpaqueMessage::new(
                rustls::ContentType::from(head[0]),
                rustls::ProtocolVersion::from(u16::from_be_bytes([head[1], head[2]])),
                &mut body[..len],
            );
            let decrypter: &mut dyn rustls::crypto::cipher::MessageDecrypter = match &mut self.rx {
                Key::Secret(key, iv) => &mut **expanded.get_or_insert_with(|| {
                    self.suite
                        .aead_alg
                        .decrypter((*key).into(), rustls::crypto::cipher::Iv::new(*iv))
                }),
                Key::Expanded(d) => &mut **d,
            };
            let plain = match decrypter.decrypt(message, self.rx_seq) {
                Ok(plain) => plain,
                Err(e) => break Err(e),
            };
            self.rx_seq += 1;
            at += 5 + len;
            match plain.typ {
                rustls::ContentType::ApplicationData => self.plain.extend_from_slice(plain.payload),
                rustls::ContentType::Alert => self.peer_closed = true,
                // A KeyUpdate (or any other handshake message) would need
                // the key schedule: the stream ends, the client reconnects.
                _ => {
                    break Err(rustls::Error::General(
                        "a TLS message after the handshake that a stream does not take".into(),
                    ));
                }
            }
        };
        self.incoming.drain(..at);
        if self.incoming.is_empty() {
            self.incoming = Vec::new();
        }
        result
    }
}

/// Moves up to `buf.len()` bytes from the front of `plain` into `buf`,
/// freeing `plain` once it is empty.
fn take(plain: &mut Vec<u8>, buf: &mut [u8]) -> usize {
    let n = buf.len().min(plain.len());
    buf[..n].copy_from_slice(&plain[..n]);
    plain.drain(..n);
    if plain.is_empty() {
        *plain = Vec::new();
    }
    n
}

/// A short reason for a TLS error, for logs and counts.
fn tls_reason(e: &rustls::Error) -> &'static str {
    match e {
        rustls::Error::InvalidMessage(_) => "not a TLS handshake",
        rustls::Error::NoApplicationProtocol => "no common ALPN protocol",
        rustls::Error::PeerIncompatible(_) => "no common TLS version or cipher suite",
        rustls::Error::AlertReceived(_) => "the client sent an alert",
        rustls::Error::PeerMisbehaved(_) => "the client broke the TLS protocol",
        _ => "TLS error",
    }
}

/// A TLS connection on a lean path, before it is a stream or actix-web's:
/// the socket and its session, which a refusal is written through.
pub(crate) struct TlsWire {
    pub(crate) io: TcpStream,
    pub(crate) session: Session,
}

impl Wire for TlsWire {
    fn socket(&self) -> &TcpStream {
        &self.io
    }

    async fn write_last(&mut self, data: &[u8]) {
        self.session
            .write_and_close(&self.io, data, Instant::now() + CLOSE_AFTER_ANSWER)
            .await;
    }
}

/// A TLS connection's request line, as the session decrypts it: what
/// `classify` reads on a TLS port. The session keeps every decrypted byte
/// (`Session::plain`), so nothing is copied.
pub(crate) struct DecryptedLine<'a> {
    io: &'a TcpStream,
    session: &'a mut Session,
    /// Where a record that fails is counted ([`refused`]).
    stats: &'a Stats,
    deadline: Instant,
    /// The longest request line a lean stream may have (see `Line`).
    max_line: usize,
}

impl<'a> DecryptedLine<'a> {
    pub(crate) fn new(
        io: &'a TcpStream,
        session: &'a mut Session,
        stats: &'a Stats,
        deadline: Instant,
        max_line: usize,
    ) -> Self {
        DecryptedLine {
            io,
            session,
            stats,
            deadline,
            max_line: max_line.max(PEEK_BYTES),
        }
    }
}

impl Line for DecryptedLine<'_> {
    async fn look(&mut self) -> Result<(&[u8], bool), HeadError> {
        let plain = &self.session.plain;
        Ok((plain, plain.len() >= self.max_line))
    }

    async fn more(&mut self, _seen: usize) -> Result<(), HeadError> {
        let read = self.session.read_plain(self.io, self.deadline).await;
        if let Err(e @ HeadError::Tls(_)) = read {
            refused(self.stats, e);
        }
        read
    }
}

/// Counts and logs a TLS connection refused before its head was read,
/// which gets no HTTP answer (the client could not read one): a handshake
/// out of time, or a handshake or record that failed. A client that went
/// away is not counted.
pub(crate) fn refused(stats: &Stats, e: HeadError) {
    let counter = match e {
        HeadError::Timeout => &stats.tls_handshake_timeouts,
        HeadError::Gone => return,
        _ => &stats.tls_handshake_failures,
    };
    counter.fetch_add(1, Relaxed);
    tracing::debug!(event = "tls_refused", cause = ?e, "TLS connection refused before its head");
}

/// A TLS connection's request head, as the session decrypts it: what
/// `consume_head` reads on a TLS port, from the head's first byte (the
/// request line `classify` read is still in `Session::plain`).
pub(crate) struct DecryptedHead<'a> {
    io: &'a TcpStream,
    session: &'a mut Session,
    /// Bytes of `session.plain` shown to `consume_head` so far.
    shown: usize,
}

impl<'a> DecryptedHead<'a> {
    pub(crate) fn new(io: &'a TcpStream, session: &'a mut Session) -> Self {
        DecryptedHead {
            io,
            session,
            shown: 0,
        }
    }
}

impl HeadSource for DecryptedHead<'_> {
    async fn read_on<R>(
        &mut self,
        deadline: Instant,
        f: impl FnOnce(&[u8], usize) -> Option<R>,
    ) -> Result<Option<R>, HeadError> {
        if self.shown == self.session.plain.len() {
            self.session.read_plain(self.io, deadline).await?;
        }
        let shown = std::mem::replace(&mut self.shown, self.session.plain.len());
        Ok(f(&self.session.plain, shown))
    }
}

/// A TLS connection for actix-web, after its request head was read here.
pub(crate) struct TlsIo {
    io: TcpStream,
    session: Session,
    /// Ciphertext the socket has not taken yet.
    out: Vec<u8>,
    /// close_notify queued.
    shut: bool,
}

/// Past this much unsent ciphertext, writes wait for the socket.
const OUT_HIGH: usize = 64 * 1024;

impl TlsIo {
    pub(crate) fn new(io: TcpStream, session: Session) -> Self {
        TlsIo {
            io,
            session,
            out: Vec::new(),
            shut: false,
        }
    }

    pub(crate) fn socket(&self) -> &TcpStream {
        &self.io
    }

    /// Moves `out` to the socket; ready once it is all there.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            ready!(self.io.poll_write_ready(cx))?;
            match self.io.try_write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.out = Vec::new();
        Poll::Ready(Ok(()))
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl AsyncRead for TlsIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.session.plain.is_empty() {
                let n = this.session.take_plain(buf.initialize_unfilled());
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.session.peer_closed {
                return Poll::Ready(Ok(()));
            }
            ready!(this.io.poll_read_ready(cx))?;
            let mut chunk = [0u8; READ_CHUNK];
            match this.io.try_read(&mut chunk) {
                Ok(0) => {
                    this.session.peer_closed = true;
                }
                Ok(n) => {
                    this.session
                        .received(&chunk[..n], &mut this.out)
                        .map_err(invalid)?;
                    // TLS's own answers (a key update) go out at once.
                    if !this.out.is_empty() {
                        let _ = this.poll_drain(cx)?;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.out.len() >= OUT_HIGH {
            ready!(this.poll_drain(cx))?;
        }
        this.session
            .encrypt(data, false, &mut this.out)
            .map_err(invalid)?;
        let _ = this.poll_drain(cx)?;
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_drain(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            this.shut = true;
            // A connection that failed may not encrypt any more.
            let _ = this.session.encrypt(&[], true, &mut this.out);
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::sync::Arc;

    use super::{Acceptor, Key, Protection};

    /// A test authority and a certificate for 127.0.0.1 (openssl), in `dir`.
    fn certificates(dir: &std::path::Path) -> (String, String, String) {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl (apt-get install -y openssl)");
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-days", "2", "-subj", "/CN=unit test authority"];
        ca.extend(ec);
        ca.extend([
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ]);
        run(&ca);
        let mut csr = vec![
            "req",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "s.key",
            "-out",
            "s.csr",
        ];
        csr.extend(ec);
        run(&csr);
        std::fs::write(
            dir.join("s.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        run(&[
            "x509",
            "-req",
            "-in",
            "s.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "s.crt",
            "-extfile",
            "s.ext",
        ]);
        let path = |f: &str| dir.join(f).display().to_string();
        (path("ca.pem"), path("s.crt"), path("s.key"))
    }

    /// A TLS 1.3 stream, its head read, keeps its two secrets and no
    /// buffer; what it seals a rustls client reads, what the client sends
    /// it reads, and a close_notify ends it.
    #[test]
    fn a_tls13_stream_keeps_its_secrets_and_no_buffer() {
        let (mut protection, mut client) = established(false);
        let Protection::Records(records) = &protection else {
            panic!("a TLS 1.3 stream keeps records, not its session");
        };
        assert!(matches!(records.tx, Key::Secret(..)) && matches!(records.rx, Key::Secret(..)));
        assert_eq!((records.incoming.capacity(), records.plain.capacity()), (0, 0));
        assert!(size_of::<Protection>() <= 200, "{}", size_of::<Protection>());

        let mut sealed = Vec::new();
        protection.encrypt(b"event one\n", false, &mut sealed).unwrap();
        protection.encrypt(b"event two\n", false, &mut sealed).unwrap();
        client.read_tls(&mut &sealed[..]).unwrap();
        client.process_new_packets().unwrap();
        let mut got = Vec::new();
        let mut chunk = [0u8; 64];
        while let Ok(n) = client.reader().read(&mut chunk) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got, b"event one\nevent two\n");

        client.writer().write_all(b"ping").unwrap();
        let mut wire = Vec::new();
        client.write_tls(&mut wire).unwrap();
        // In pieces, as a socket may hand it over.
        let (a, b) = wire.split_at(3);
        protection.received(a, &mut Vec::new()).unwrap();
        assert!(!protection.has_plain());
        protection.received(b, &mut Vec::new()).unwrap();
        let mut buf = [0u8; 16];
        let n = protection.take_plain(&mut buf);
        assert_eq!(&buf[..n], b"ping");
        let Protection::Records(records) = &protection else {
            unreachable!()
        };
        assert_eq!((records.incoming.capacity(), records.plain.capacity()), (0, 0));

        client.send_close_notify();
        let mut wire = Vec::new();
        client.write_tls(&mut wire).unwrap();
        protection.received(&wire, &mut Vec::new()).unwrap();
        assert!(protection.peer_closed());
    }

    /// A server's acceptor for the tests below and its authority's
    /// certificate file, made once per test binary.
    fn fixture() -> &'static (Acceptor, String) {
        static FIXTURE: std::sync::OnceLock<(Acceptor, String)> = std::sync::OnceLock::new();
        FIXTURE.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("switchboard-tls-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let (ca, cert, key) = certificates(&dir);
            (Acceptor::new(&cert, &key).unwrap(), ca)
        })
    }

    fn acceptor() -> &'static Acceptor {
        &fixture().0
    }

    /// A client of 127.0.0.1 speaking only TLS 1.2 or only TLS 1.3.
    fn client(tls12: bool, roots: rustls::RootCertStore) -> rustls::ClientConnection {
        let versions: &[&rustls::SupportedProtocolVersion] = if tls12 {
            &[&rustls::version::TLS12]
        } else {
            &[&rustls::version::TLS13]
        };
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let name = rustls::pki_types::ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
        rustls::ClientConnection::new(Arc::new(config), name).unwrap()
    }

    /// A real client's first flight (its ClientHello records), the seed the
    /// fuzzer below mutates.
    fn client_hello(tls12: bool) -> Vec<u8> {
        let mut client = client(tls12, rustls::RootCertStore::empty());
        let mut wire = Vec::new();
        client.write_tls(&mut wire).unwrap();
        wire
    }

    /// Feeds `wire` to `session` in pieces cut at `cuts`, then asks it to
    /// write, as a connection's read and write paths would; once it has
    /// failed it is fed again, as a caller that ignored the error would.
    fn feed(session: &mut super::Session, wire: &[u8], cuts: &[usize]) {
        let mut at = 0;
        let mut pieces: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        pieces.sort_unstable();
        pieces.push(wire.len());
        let mut out = Vec::new();
        let mut failed = false;
        for end in pieces {
            if end < at {
                continue;
            }
            failed |= session.received(&wire[at..end], &mut out).is_err();
            at = end;
        }
        let _ = session.encrypt(b"HTTP/1.1 400 Bad Request\r\n\r\n", true, &mut out);
        if failed {
            assert!(session.received(&wire[..wire.len().min(7)], &mut out).is_err());
            assert!(session.encrypt(b"x", true, &mut out).is_err());
            assert_eq!(session.incoming.capacity(), 0, "a failed session keeps no buffer");
        }
    }

    /// The record of issue 40: a ClientHello whose declared length is far
    /// longer than the 38 bytes its 47-byte record carries. rustls kept
    /// the half message's place in the read buffer; the alert after the
    /// error was asked for with an empty buffer and rustls panicked
    /// (`range start index 43 out of range for slice of length 0`).
    #[test]
    fn a_handshake_message_longer_than_its_record_is_refused_without_a_panic() {
        let mut hs = vec![0x01, 0xff, 0xff, 0xff, 0x03, 0x03];
        hs.extend([0u8; 32]);
        let mut wire = vec![0x16, 0x03, 0x01];
        wire.extend((hs.len() as u16).to_be_bytes());
        wire.extend(&hs);
        assert_eq!(wire.len(), 43);
        for cuts in [vec![], vec![5], vec![1, 2, 3, 20]] {
            let mut session = acceptor().session().unwrap();
            let mut out = Vec::new();
            let mut result = Ok(());
            let mut at = 0;
            for end in cuts.iter().copied().chain([wire.len()]) {
                result = result.and(session.received(&wire[at..end], &mut out));
                at = end;
            }
            // The record is incomplete as a message, not as a record: the
            // server waits for more, or refuses it; either way the next
            // calls are answered, not a panic.
            feed(&mut session, &wire, &[]);
            let _ = result;
        }
    }

    /// What a fuzzer does to the bytes of a record sequence.
    #[derive(Debug, Clone)]
    enum Mutation {
        /// XOR one byte.
        Flip(usize, u8),
        /// Overwrite a 16- or 24-bit length field (a record's or a
        /// handshake message's) at the offset.
        Length(usize, u32),
        /// Cut the wire there.
        Truncate(usize),
        /// Insert bytes there.
        Insert(usize, Vec<u8>),
    }

    fn mutate(mut wire: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
        for m in mutations {
            let n = wire.len().max(1);
            match m {
                Mutation::Flip(at, mask) => {
                    if let Some(b) = wire.get_mut(at % n) {
                        *b ^= mask;
                    }
                }
                Mutation::Length(at, v) => {
                    let at = at % n;
                    for (i, b) in v.to_be_bytes()[1..].iter().enumerate() {
                        if let Some(w) = wire.get_mut(at + i) {
                            *w = *b;
                        }
                    }
                }
                Mutation::Truncate(at) => wire.truncate(at % n),
                Mutation::Insert(at, bytes) => {
                    let at = (at % n).min(wire.len());
                    wire.splice(at..at, bytes.iter().copied());
                }
            }
        }
        wire
    }

    /// One record: a content type (mostly real ones), a version, a declared
    /// length that may lie, and a body.
    fn record() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        (
            prop_oneof![Just(20u8), Just(21), Just(22), Just(23), any::<u8>()],
            any::<u16>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            prop_oneof![Just(None), any::<u16>().prop_map(Some)],
            prop_oneof![
                Just(Vec::new()),
                // A handshake message header that may lie about its length.
                (0u8..30, any::<u32>()).prop_map(|(t, l)| {
                    let mut h = vec![t];
                    h.extend(&l.to_be_bytes()[1..]);
                    h
                }),
            ],
        )
            .prop_map(|(typ, version, body, declared, head)| {
                let mut payload = head;
                payload.extend(body);
                let len = declared.unwrap_or(payload.len() as u16);
                let mut r = vec![typ];
                r.extend(version.to_be_bytes());
                r.extend(len.to_be_bytes());
                r.extend(payload);
                r
            })
    }

    fn mutation() -> impl proptest::strategy::Strategy<Value = Mutation> {
        use proptest::prelude::*;
        prop_oneof![
            (any::<usize>(), 1u8..).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
            (any::<usize>(), any::<u32>()).prop_map(|(a, v)| Mutation::Length(a, v)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..48))
                .prop_map(|(a, b)| Mutation::Insert(a, b)),
        ]
    }

    /// A lean stream's TLS after a real handshake and head (TLS 1.2 keeps
    /// its session, TLS 1.3 its records), and the client that made it.
    fn established(tls12: bool) -> (Protection, rustls::ClientConnection) {
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject as _;
        for c in rustls::pki_types::CertificateDer::pem_file_iter(&fixture().1).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let mut client = client(tls12, roots);
        let request = b"GET /test/x HTTP/1.1\r\nhost: t\r\n\r\n";
        client.writer().write_all(request).unwrap();
        let mut session = acceptor().session().unwrap();
        for _ in 0..10 {
            if session.plain.len() >= request.len() {
                break;
            }
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            let mut out = Vec::new();
            session.received(&wire, &mut out).unwrap();
            client.read_tls(&mut &out[..]).unwrap();
            client.process_new_packets().unwrap();
        }
        assert_eq!(session.plain, request);
        session.plain.clear();
        (Protection::of(session), client)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 200,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// After the handshake (TLS 1.2's session, TLS 1.3's hand-written
        /// record layer): a real record from the client, then made-up or
        /// mutated ones. The stream reads, refuses or ends; it never panics,
        /// and once refused it stays refused.
        #[test]
        fn records_after_the_handshake_never_panic(
            tls12 in proptest::prelude::any::<bool>(),
            records in proptest::collection::vec(record(), 0..6),
            mutations in proptest::collection::vec(mutation(), 0..4),
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..6),
        ) {
            let (mut protection, mut client) = established(tls12);
            client.writer().write_all(b"ping").unwrap();
            let mut wire = Vec::new();
            client.write_tls(&mut wire).unwrap();
            wire.extend(records.concat());
            let wire = mutate(wire, &mutations);
            let mut pieces: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
            pieces.sort_unstable();
            pieces.push(wire.len());
            let (mut at, mut out, mut failed) = (0, Vec::new(), false);
            for end in pieces {
                if !failed && end >= at {
                    failed = protection.received(&wire[at..end], &mut out).is_err();
                    at = end;
                }
            }
            let mut buf = [0u8; 64];
            while protection.take_plain(&mut buf) > 0 {}
            let _ = protection.encrypt(b"event\n", false, &mut out);
            if failed {
                let _ = protection.received(b"\x17\x03\x03\x00\x01x", &mut out);
            }
        }
    }

    proptest::proptest! {
        // A bounded fuzz in every `cargo test` (CI): about 3 s. The
        // generator is compiled with opt-level 3 (Cargo.toml).
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 1500,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// A real ClientHello (TLS 1.2 or 1.3), mutated, cut anywhere:
        /// the session refuses it or goes on, and never panics.
        #[test]
        fn a_mutated_client_hello_never_panics(
            tls12 in proptest::prelude::any::<bool>(),
            mutations in proptest::collection::vec(mutation(), 1..6),
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..6),
        ) {
            let wire = mutate(client_hello(tls12), &mutations);
            let mut session = acceptor().session().unwrap();
            feed(&mut session, &wire, &cuts);
        }

        /// Record sequences made up from scratch, after a real ClientHello
        /// or alone.
        #[test]
        fn made_up_records_never_panic(
            hello in proptest::prelude::any::<bool>(),
            records in proptest::collection::vec(record(), 1..8),
            cuts in proptest::collection::vec(proptest::prelude::any::<usize>(), 0..6),
        ) {
            let mut wire = if hello { client_hello(false) } else { Vec::new() };
            wire.extend(records.concat());
            let mut session = acceptor().session().unwrap();
            feed(&mut session, &wire, &cuts);
        }
    }

    /// What an idle TLS stream holds inline besides its socket: rustls'
    /// unbuffered connection (its state machine, record layer and the
    /// empty vectors it keeps) and this module's two empty vectors. Its
    /// keys and handshake state are on the heap besides (BENCHMARKS.md has
    /// the measured total). A rustls update that grows it shows here.
    #[test]
    fn an_idle_session_stays_under_1200_bytes_inline() {
        let session = size_of::<super::Session>();
        let conn = size_of::<rustls::server::UnbufferedServerConnection>();
        assert!(
            session <= 1200,
            "Session is {session} bytes, of which rustls {conn}"
        );
        assert!(
            size_of::<rustls::ServerConnection>() >= conn,
            "the buffered connection is never the smaller"
        );
    }
}
