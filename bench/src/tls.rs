//! The certificates of a run's TLS streams (`--transports tls,tls-sse,tls-ws`):
//! a test authority and a server certificate it signed for `127.0.0.1` and
//! `localhost`, made with the `openssl` command line in the run's temporary
//! directory. The servers are given the certificate and key; floodtest
//! trusts the authority (`--tls-ca`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// One run's certificate files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// The authority's certificate: what floodtest trusts.
    pub ca: PathBuf,
    /// The server's certificate, for `IP:127.0.0.1` and `DNS:localhost`.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

/// The server certificate's extensions: what a browser-grade client checks.
const SERVER_EXTENSIONS: &str = "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n";

/// Makes the authority and the server certificate in `dir` (P-256 keys,
/// valid two days).
pub(crate) fn make_certificates(dir: &Path) -> anyhow::Result<TlsFiles> {
    let file = |name: &str| dir.join(name);
    let (ca_key, ca, key, csr, cert, ext) = (
        file("bench-ca.key"),
        file("bench-ca.pem"),
        file("server.key"),
        file("server.csr"),
        file("server.crt"),
        file("server.ext"),
    );
    let p = |p: &Path| p.display().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ]
    .map(String::from);
    let mut args: Vec<String> = [
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=switchboard bench test authority",
    ]
    .map(String::from)
    .to_vec();
    args.extend(ec.clone());
    args.extend([
        "-keyout".into(),
        p(&ca_key),
        "-out".into(),
        p(&ca),
        "-addext".into(),
        "basicConstraints=critical,CA:TRUE".into(),
        "-addext".into(),
        "keyUsage=critical,keyCertSign,cRLSign".into(),
    ]);
    openssl(dir, &args)?;
    let mut args: Vec<String> = ["req", "-subj", "/CN=127.0.0.1"].map(String::from).to_vec();
    args.extend(["-keyout".into(), p(&key), "-out".into(), p(&csr)]);
    args.extend(ec);
    openssl(dir, &args)?;
    std::fs::write(&ext, SERVER_EXTENSIONS).with_context(|| format!("writing {}", ext.display()))?;
    openssl(
        dir,
        &[
            "x509".into(),
            "-req".into(),
            "-in".into(),
            p(&csr),
            "-CA".into(),
            p(&ca),
            "-CAkey".into(),
            p(&ca_key),
            "-CAcreateserial".into(),
            "-days".into(),
            "2".into(),
            "-out".into(),
            p(&cert),
            "-extfile".into(),
            p(&ext),
        ],
    )?;
    Ok(TlsFiles { ca, cert, key })
}

fn openssl(dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl (apt-get install -y openssl)")?;
    if !out.status.success() {
        bail!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_a_server_certificate_signed_by_the_authority() {
        let dir = crate::process::TempDir::new("tls-test").unwrap();
        let files = make_certificates(dir.path()).unwrap();
        for f in [&files.ca, &files.cert, &files.key] {
            assert!(f.is_file(), "{}", f.display());
        }
        let verify = Command::new("openssl")
            .args(["verify", "-purpose", "sslserver", "-CAfile"])
            .arg(&files.ca)
            .arg(&files.cert)
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stderr)
        );
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&files.cert)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("IP Address:127.0.0.1"), "{text}");
        assert!(text.contains("DNS:localhost"), "{text}");
    }
}
