//! Writing a whole buffer to a non-blocking socket: below both the lean
//! paths' socket helpers (`crate::conn::socket`) and TLS (`crate::conn::tls`), which
//! both need it.

use std::io;

use actix_rt::net::TcpStream;

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
