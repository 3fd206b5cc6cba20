//! The application's HTTP endpoints (the identity provider's JWKS,
//! `auth.jwks_url`; the subscribe hook, `hooks.subscribe_url`; the
//! webhooks, `hooks.events_url`), called from one thread of their own.
//!
//! The HTTP client is reqwest, with its keep-alive pool. Its connections
//! are tasks of the runtime they were opened on, so it gets one runtime of
//! its own, on the `switchboard-backend` thread, rather than the actix
//! workers' (each its own runtime): a worker awaits a call's
//! [`JoinHandle`] with its own bound on the wait, and a backend that
//! hangs holds no worker and no stream.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a connection to an endpoint may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The backend thread's runtime and its HTTP client. The thread stops
/// when this is dropped.
pub(crate) struct Backend {
    handle: Handle,
    client: reqwest::Client,
    /// Dropped with the backend: the thread's runtime then stops.
    _stop: oneshot::Sender<()>,
}

impl Backend {
    /// The backend of the application's `endpoints` (`auth.jwks_url`,
    /// `hooks.subscribe_url`, `hooks.events_url`: `Settings::endpoints`),
    /// started when one is set: one thread for them all.
    pub(crate) fn of(endpoints: &[&str]) -> io::Result<Option<Arc<Backend>>> {
        if endpoints.iter().all(|url| url.trim().is_empty()) {
            return Ok(None);
        }
        Backend::start().map(Some)
    }

    /// Starts the thread.
    pub(crate) fn start() -> io::Result<Arc<Backend>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("switchboard-backend".to_owned())
            .spawn(move || {
                // Ends when the sender is dropped (or sends).
                let _ = runtime.block_on(stopped);
            })?;
        let client = {
            let _in = handle.enter();
            client().map_err(|e| io::Error::other(format!("the HTTP client: {e}")))?
        };
        Ok(Arc::new(Backend {
            handle,
            client,
            _stop: stop,
        }))
    }

    /// Runs `call` on the backend thread.
    pub(crate) fn spawn<F>(&self, call: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(call)
    }

    /// The HTTP client (its requests run where they are awaited: use it
    /// inside [`Backend::spawn`]).
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

/// The HTTP client: rustls with ring and the system's roots (an endpoint
/// on http:// needs none), no redirects followed (an endpoint that moves
/// is a configuration to fix, and a redirect must not send a request
/// where the operator did not point it), no proxy from the environment.
fn client() -> Result<reqwest::Client, reqwest::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(60))
        .build()
}

/// Reads `response`'s body, up to `max` bytes; past that, an error naming
/// the limit (the rest is not read).
pub(crate) async fn body_within(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    if response.content_length().is_some_and(|n| n > max as u64) {
        return Err(format!("its answer is over {max} bytes"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(request_error)? {
        if body.len() + chunk.len() > max {
            return Err(format!("its answer is over {max} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An HTTP client error with its causes (reqwest's own text says only
/// "error sending request"), without the URL (it may carry a password or
/// a key, and the text reaches clients in a 503).
pub(crate) fn request_error(e: reqwest::Error) -> String {
    error_chain(&e.without_url())
}

/// An error with its causes.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
