//! One connection pipeline: everything between a listening socket and the
//! request a connection makes, over one wire (a plain `TcpStream`, or that
//! socket with a TLS session on it). It owns, in the order a connection
//! meets them:
//!
//! 1. `serve`: accepting on a listener (a `max_connections` slot first,
//!    the file-descriptor limit ridden out), then the one `match` that
//!    decides what becomes of the connection;
//! 2. `edge`: the PROXY protocol header a load balancer sends first, the
//!    client's real address (also `X-Forwarded-For` from a trusted proxy),
//!    and the limits per client address;
//! 3. `tls`: on a TLS port, the handshake, the compact rustls session every
//!    TLS connection starts with, the record layer an idle TLS 1.3 stream
//!    keeps, and the certificate SIGHUP reloads;
//! 4. `classify`: the request line (lean stream, lean `/dispatcher`, or
//!    actix-web), then a lean stream's head, read and checked;
//! 5. `handshake`: what a stream request asks for beyond its id
//!    (transport, HTTP version, resume point, token, origin);
//! 6. `dispatcher`: the lean `GET /dispatcher` path;
//! 7. `socket`: socket I/O for the lean paths (refusing with a clean close,
//!    handing a connection to actix-web with bytes put back in front),
//!    `wire`: writing a whole buffer, and `http_date`: the `Date` header of
//!    the answers the lean paths write.
//!
//! What a connection becomes afterwards is not here: a stream's admission
//! (`crate::admission`), the Stream actor (`crate::stream`), actix-web's
//! routes (`crate::routes`). Binding, workers, signals and shutdown are in
//! `crate::server`.

pub(crate) mod classify;
pub(crate) mod dispatcher;
pub(crate) mod edge;
pub(crate) mod handshake;
pub(crate) mod http_date;
pub(crate) mod serve;
pub(crate) mod socket;
pub(crate) mod tls;
pub(crate) mod wire;
