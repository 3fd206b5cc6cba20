//! A connection's wire on the lean paths, plain or TLS ([`Wire`]), and
//! writing a whole buffer to a non-blocking socket: below both the lean
//! paths' socket helpers (`crate::conn::socket`) and TLS
//! (`crate::conn::tls`), which both need them.

use std::io;
use std::time::Duration;

use actix_rt::net::TcpStream;

/// How long a connection's last answer, a few hundred bytes that the socket
/// takes at once, has to go out before the connection is closed: a TLS
/// refusal's, and the answer of a request whose handler asked for the
/// connection to be closed (`crate::conn::socket::CloseHandle`).
pub(crate) const CLOSE_AFTER_ANSWER: Duration = Duration::from_millis(100);

/// What a lean path answers through before the connection is a stream or
/// actix-web's: the socket itself, or the socket with its TLS session
/// (`crate::conn::tls::TlsWire`). A refusal is written once, for both
/// (`crate::conn::socket::refuse`).
pub(crate) trait Wire {
    /// The socket underneath.
    fn socket(&self) -> &TcpStream;

    /// Writes `data`, the connection's last answer, best effort: on a plain
    /// socket what it takes at once (a refusal always fits a fresh socket's
    /// buffer), over TLS encrypted with a close_notify behind it, for at
    /// most [`CLOSE_AFTER_ANSWER`].
    async fn write_last(&mut self, data: &[u8]);
}

impl Wire for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }

    async fn write_last(&mut self, data: &[u8]) {
        let _ = self.try_write(data);
    }
}

/// Writes all of `out`, waiting for the socket to take it.
pub(crate) async fn write_all(io: &TcpStream, mut out: &[u8]) -> io::Result<()> {
    while !out.is_empty() {
        io.writable().await?;
        match io.try_write(out) {
            Ok(k) => out = &out[k..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
