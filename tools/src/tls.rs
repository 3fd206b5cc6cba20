//! TLS for `https://` targets: one rustls client configuration (the `ring`
//! provider, TLS 1.2 and 1.3, ALPN `http/1.1`) trusting either `--tls-ca`
//! or the system's root certificates, and the connections made with it:
//! floodtest's streams (`flood::conn`), its message sender and its
//! statistics reads.
//!
//! Session resumption is off: every stream is a separate client with a full
//! handshake, as many browsers connecting once each would be.

use std::io::{self, Read as _, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The client configuration for `https://` targets: trusting the PEM
/// certificates in `ca`, or the system's roots (rustls-native-certs) when
/// there is no `ca`.
pub(crate) fn client_config(ca: Option<&Path>) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("--tls-ca: reading {}", path.display()))?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("--tls-ca: {} is not PEM certificates", path.display()))?;
            if certs.is_empty() {
                bail!("--tls-ca: {} holds no PEM certificate", path.display());
            }
            for cert in certs {
                roots
                    .add(cert)
                    .with_context(|| format!("--tls-ca: a certificate in {}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                bail!(
                    "no system root certificates found{}; give --tls-ca FILE",
                    found.errors.first().map_or(String::new(), |e| format!(" ({e})"))
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("the ring provider's TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// [`client_config`] when `needed` (some target is `https://`), else none.
pub(crate) fn client_config_if(needed: bool, ca: Option<&Path>) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    needed.then(|| client_config(ca)).transpose()
}

/// The name a server's certificate must hold: the URL's host, an IP
/// address or a DNS name.
pub(crate) fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::from(ip));
    }
    ServerName::try_from(host.to_owned()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A TLS client connection over tokio's TCP.
pub(crate) type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// The TLS handshake with `host` over `tcp`.
pub(crate) async fn handshake(
    config: &Arc<ClientConfig>,
    host: &str,
    tcp: TcpStream,
) -> io::Result<TlsStream> {
    TlsConnector::from(Arc::clone(config))
        .connect(server_name(host)?, tcp)
        .await
}

/// A connection that is plain or TLS, for the few connections that are not
/// streams (the message sender's).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin {}

impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

/// Connects to `addr`, with TLS to `host` when `config` is given.
pub(crate) async fn connect(
    addr: SocketAddr,
    host: &str,
    config: Option<&Arc<ClientConfig>>,
) -> io::Result<Box<dyn Io>> {
    let tcp = TcpStream::connect(addr).await?;
    Ok(match config {
        Some(config) => Box::new(handshake(config, host, tcp).await?),
        None => Box::new(tcp),
    })
}

/// A blocking request over `tcp`, with TLS to `host` when `config` is given;
/// returns every byte the server sent until it closed (or `timeout` passed
/// between two reads). For `connection: close` requests.
pub(crate) fn blocking_exchange(
    addr: SocketAddr,
    host: &str,
    config: Option<&Arc<ClientConfig>>,
    request: &[u8],
    timeout: Duration,
) -> io::Result<Vec<u8>> {
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    let mut buf = Vec::new();
    match config {
        None => {
            tcp.write_all(request)?;
            tcp.read_to_end(&mut buf)?;
        }
        Some(config) => {
            let conn = rustls::ClientConnection::new(Arc::clone(config), server_name(host)?)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            tls.write_all(request)?;
            tls.flush()?;
            // A server that closes without close_notify ends with an error
            // after the whole answer: keep what arrived.
            let mut chunk = [0u8; 8192];
            loop {
                match tls.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if buf.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_are_ip_addresses_or_dns_names() {
        assert_eq!(
            server_name("127.0.0.1").unwrap(),
            ServerName::from("127.0.0.1".parse::<IpAddr>().unwrap())
        );
        assert!(matches!(server_name("::1").unwrap(), ServerName::IpAddress(_)));
        assert!(matches!(
            server_name("localhost").unwrap(),
            ServerName::DnsName(_)
        ));
        assert!(server_name("not a name").is_err());
    }

    #[test]
    fn a_ca_file_must_hold_certificates() {
        let dir = std::env::temp_dir().join(format!("tools-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = client_config(Some(&empty)).unwrap_err().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        let err = client_config(Some(&dir.join("absent.pem")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("reading"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
