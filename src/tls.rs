//! https:// and wss:// served natively (`server.tls_cert_file`,
//! `server.tls_key_file`, `server.tls_ports`).
//!
//! Every TLS connection is a rustls [`UnbufferedServerConnection`]: the
//! buffered `ServerConnection` keeps a deframer buffer of at least 4 KiB for
//! its whole life once it has read anything (rustls 0.23's
//! `DeframerVecBuffer::prepare_read`), which would cost every idle stream
//! more than all the rest of it. With the unbuffered API the connection
//! keeps only its state and keys; the ciphertext it has not yet decrypted
//! and the plaintext not yet taken live in this module's [`Session`], in
//! vectors that are empty, and unallocated, whenever the stream is idle.
//!
//! A [`Session`] is driven from the socket by the async functions here
//! (the handshake, the request head) and then either by a lean stream's
//! sink (`crate::stream::sink`) or, for actix-web, by [`TlsIo`]. The
//! certificate is resolved per handshake from [`Certificates`], which SIGHUP
//! reloads: open connections keep their keys, new ones get the new
//! certificate.

use std::io;
use std::pin::Pin;
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

use crate::classify::HeadError;

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
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&certificates.provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| LoadError {
                key: "server.tls_cert_file",
                reason: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&certificates) as Arc<dyn ResolvesServerCert>);
        // curl --http1.0 offers only "http/1.0".
        config.alpn_protocols = vec![b"http/1.1".to_vec(), b"http/1.0".to_vec()];
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
    fn step(&mut self, out: &mut Vec<u8>, send: Option<(&[u8], bool)>) -> Result<Stop, rustls::Error> {
        loop {
            let UnbufferedStatus { mut discard, state } = self.conn.process_tls_records(&mut self.incoming);
            let stop = match state? {
                ConnectionState::ReadTraffic(mut records) => {
                    while let Some(record) = records.next_record() {
                        let record = record?;
                        discard += record.discard;
                        self.plain.extend_from_slice(record.payload);
                    }
                    None
                }
                ConnectionState::EncodeTlsData(mut data) => {
                    append(out, 4096, |buf| Ok(data.encode(buf)?))?;
                    None
                }
                // What was encoded goes out with `out`, before anything
                // encrypted after it.
                ConnectionState::TransmitTlsData(data) => {
                    data.done();
                    None
                }
                ConnectionState::PeerClosed => {
                    self.peer_closed = true;
                    None
                }
                ConnectionState::BlockedHandshake => Some(Stop::Handshaking),
                ConnectionState::Closed => Some(Stop::Closed),
                ConnectionState::WriteTraffic(mut traffic) => {
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
                    Some(Stop::Traffic)
                }
                // Early data is off (the default), so never offered.
                _ => return Err(rustls::Error::General("unexpected TLS state".into())),
            };
            self.incoming.drain(..discard);
            if let Some(stop) = stop {
                if self.incoming.is_empty() {
                    self.incoming = Vec::new();
                }
                return Ok(stop);
            }
        }
    }

    /// Takes `bytes` read from the socket; TLS's own output goes to `out`.
    pub(crate) fn received(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), rustls::Error> {
        self.incoming.extend_from_slice(bytes);
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
        let n = buf.len().min(self.plain.len());
        buf[..n].copy_from_slice(&self.plain[..n]);
        self.plain.drain(..n);
        if self.plain.is_empty() {
            self.plain = Vec::new();
        }
        n
    }

    /// Reads once from `io` (waiting until `deadline`) and processes it.
    async fn read_once(&mut self, io: &TcpStream, deadline: Instant) -> Result<(), HeadError> {
        let mut buf = [0u8; READ_CHUNK];
        let n = loop {
            match timeout_at(deadline, io.readable()).await {
                Err(_) => return Err(HeadError::Timeout),
                Ok(Err(_)) => return Err(HeadError::Gone),
                Ok(Ok(())) => {}
            }
            match io.try_read(&mut buf) {
                Ok(0) => return Err(HeadError::Gone),
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Err(HeadError::Gone),
            }
        };
        let mut out = Vec::new();
        let stepped = self.received(&buf[..n], &mut out);
        if !out.is_empty() {
            // An alert for a bad record goes out too.
            let _ = timeout_at(deadline, crate::socket::write_all(io, &out)).await;
        }
        stepped.map_err(|e| HeadError::Tls(tls_reason(&e)))
    }

    /// Completes the handshake over `io` by `deadline`.
    pub(crate) async fn handshake(&mut self, io: &TcpStream, deadline: Instant) -> Result<(), HeadError> {
        loop {
            let mut out = Vec::new();
            let stop = self.step(&mut out, None);
            if !out.is_empty() {
                match timeout_at(deadline, crate::socket::write_all(io, &out)).await {
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
        let had = self.plain.len();
        while self.plain.len() == had {
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
            let _ = timeout_at(deadline, crate::socket::write_all(io, &out)).await;
        }
    }
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
