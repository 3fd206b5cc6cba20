//! The pub/sub connection to Redis, spoken here rather than through
//! redis-rs's pub/sub connection.
//!
//! Why by hand: redis-rs's pub/sub connection keeps a copy of every channel
//! it is subscribed to, which cost ~50 bytes of RSS per idle stream in
//! cluster mode (docs/design-notes.md, "Per-stream memory"). Per-stream
//! memory is what this server exists to save, so:
//!
//! - commands are still encoded by redis-rs (`redis::cmd`), and the
//!   connection address and credentials come from its parsed URL;
//! - replies are read by [`parse_reply`]: RESP2 simple strings, errors, integers,
//!   bulk strings and arrays, everything a subscribed connection receives.
//!   The tests check it against redis-rs's own parser.
//!
//! TLS (`rediss://`, a sentinel with `redis_sentinel_tls`): the socket is
//! wrapped in tokio-rustls, with the connector the cluster built from
//! `cluster.redis_ca_file` or the system's roots.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use redis::ConnectionAddr;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Deepest array nesting accepted (a subscribed connection gets depth 1).
const MAX_DEPTH: usize = 8;

/// Largest bulk string [`parse_reply`] accepts: Redis's own default
/// `proto-max-bulk-len`. A link takes far less ([`Conn::limit`]).
const MAX_BULK: usize = 512 * 1024 * 1024;

/// What a bus message may add to `message.max_bytes`: its origin, event id
/// and the space (`<instance>/<seq>@<event id> `), or a channel's name.
pub(crate) const FRAMING_BYTES: usize = 1024;

/// A link's read buffer after a large reply is given back once it is
/// empty, if it grew past this (it starts at 4 KiB).
const SHRINK_ABOVE: usize = 64 * 1024;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...`
    Error(String),
    /// `:3`
    Int(i64),
    /// `$5\r\nhello` (`None`: the null bulk string).
    Bulk(Option<Bytes>),
    /// `*3\r\n...` (`None`: the null array).
    Array(Option<Vec<Reply>>),
    /// The last element of a top-level array (a pub/sub message's payload)
    /// that was longer than the link takes: its length, its bytes dropped
    /// unread ([`Conn::limit`]).
    Oversized(usize),
}

impl Reply {
    /// The bytes of a bulk or simple string.
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

/// Parses one reply from the front of `buf`: `Ok(None)` if `buf` holds only
/// part of one, else the reply and the bytes it took.
#[cfg(test)]
fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0, 0, MAX_BULK, false)
}

/// [`parse_reply`], taking bulk strings of at most `max_bulk` bytes. A
/// longer one is known by its length line, before its bytes arrive: as the
/// last element of a top-level array (a message's payload) it is
/// [`Reply::Oversized`] and the reply's end lies past `buf` by the bytes to
/// drop; anywhere else it is an error.
fn parse_reply_within(buf: &[u8], max_bulk: usize) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0, 0, max_bulk, false)
}

fn parse_at(
    buf: &[u8],
    at: usize,
    depth: usize,
    max_bulk: usize,
    last_of_top: bool,
) -> Result<Option<(Reply, usize)>, String> {
    let Some(line_end) = find_crlf(buf, at + 1) else {
        return Ok(None);
    };
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let line = &buf[at + 1..line_end];
    let next = line_end + 2;
    let text = || String::from_utf8_lossy(line).into_owned();
    match kind {
        b'+' => Ok(Some((Reply::Simple(text()), next))),
        b'-' => Ok(Some((Reply::Error(text()), next))),
        b':' => Ok(Some((Reply::Int(number(line)?), next))),
        b'$' => {
            let len = number(line)?;
            if len < 0 {
                return Ok(Some((Reply::Bulk(None), next)));
            }
            let len = usize::try_from(len).map_err(|_| "bulk length out of range".to_owned())?;
            if len > max_bulk {
                if last_of_top {
                    return Ok(Some((Reply::Oversized(len), next + len + 2)));
                }
                return Err(format!(
                    "a bulk string of {len} bytes, more than the {max_bulk} this link takes"
                ));
            }
            if buf.len() < next + len + 2 {
                return Ok(None);
            }
            if &buf[next + len..next + len + 2] != b"\r\n" {
                return Err("bulk string not followed by CRLF".to_owned());
            }
            let body = Bytes::copy_from_slice(&buf[next..next + len]);
            Ok(Some((Reply::Bulk(Some(body)), next + len + 2)))
        }
        b'*' => {
            let len = number(line)?;
            if len < 0 {
                return Ok(Some((Reply::Array(None), next)));
            }
            if depth >= MAX_DEPTH {
                return Err("arrays nested too deep".to_owned());
            }
            // Each element takes at least 3 bytes: do not trust a huge count.
            let len = usize::try_from(len).map_err(|_| "array length out of range".to_owned())?;
            let mut items = Vec::with_capacity(len.min((buf.len() - next) / 3 + 1));
            let mut pos = next;
            for i in 0..len {
                let last = depth == 0 && i + 1 == len;
                match parse_at(buf, pos, depth + 1, max_bulk, last)? {
                    Some((item, end)) => {
                        items.push(item);
                        pos = end;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(Some(items)), pos)))
        }
        other => Err(format!("unexpected reply type byte 0x{other:02x}")),
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let tail = buf.get(from..)?;
    tail.windows(2).position(|w| w == b"\r\n").map(|i| from + i)
}

fn number(line: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not a number: {:?}", String::from_utf8_lossy(line)))
}

/// What a subscribed connection tells: a message, or the confirmation of a
/// command.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// `message <channel> <payload>`.
    Message { channel: Bytes, payload: Bytes },
    /// One channel of a SUBSCRIBE confirmed.
    Subscribed,
    /// One channel of an UNSUBSCRIBE confirmed.
    Unsubscribed,
    /// The answer to a PING.
    Pong,
    /// `message <channel> <payload>` whose payload was longer than the
    /// link takes: dropped unread, `bytes` long.
    Oversized { channel: Bytes, bytes: usize },
}

impl Received {
    /// Reads `reply` as a subscribed connection's event; an error reply or
    /// anything else is the reason the link must end.
    pub(crate) fn of(reply: Reply) -> Result<Received, String> {
        let items = match reply {
            Reply::Array(Some(items)) => items,
            Reply::Error(e) => return Err(format!("Redis answered an error: {e}")),
            // PING outside subscribed mode (not used, but harmless).
            Reply::Simple(s) if s == "PONG" => return Ok(Received::Pong),
            other => return Err(format!("unexpected reply on the pub/sub link: {other:?}")),
        };
        let kind = items.first().and_then(Reply::bytes).unwrap_or_default();
        match (kind, items.len()) {
            // `smessage`: a sharded channel's (Redis Cluster).
            (b"message" | b"smessage", 3) => match (&items[1], &items[2]) {
                (Reply::Bulk(Some(channel)), Reply::Bulk(Some(payload))) => Ok(Received::Message {
                    channel: channel.clone(),
                    payload: payload.clone(),
                }),
                (Reply::Bulk(Some(channel)), Reply::Oversized(bytes)) => Ok(Received::Oversized {
                    channel: channel.clone(),
                    bytes: *bytes,
                }),
                _ => Err("a message without channel or payload".to_owned()),
            },
            (b"subscribe" | b"ssubscribe", 3) => Ok(Received::Subscribed),
            // A `sunsubscribe` Redis sends unasked (the channel's slot
            // moved, or its master became a replica) matches no command:
            // the Bus then links again, to the slot's new master.
            (b"unsubscribe" | b"sunsubscribe", 3) => Ok(Received::Unsubscribed),
            (b"pong", 2) => Ok(Received::Pong),
            _ => Err(format!(
                "unexpected event on the pub/sub link: {:?}",
                String::from_utf8_lossy(kind)
            )),
        }
    }
}

/// Either transport a Redis URL names.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// An open pub/sub connection.
pub(crate) struct Conn {
    io: Box<dyn Transport>,
    buf: BytesMut,
    /// The longest bulk string taken. A longer message payload is dropped
    /// as it arrives, never buffered ([`Reply::Oversized`]); a longer one
    /// anywhere else is an error that ends the link.
    max_bulk: usize,
    /// Bytes still to drop of an oversized payload.
    discard: usize,
}

impl Conn {
    /// Connects to the Redis `client` names (over TLS with `tls` when its
    /// URL says `rediss://`) and authenticates as its URL says. TCP_NODELAY
    /// is set, as on the command connection.
    pub(crate) async fn open(
        client: &redis::Client,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<Conn, String> {
        let info = client.get_connection_info();
        let tcp = |host: String, port: u16| async move {
            let s = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| format!("connecting to {host}:{port}: {e}"))?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            Ok::<_, String>(s)
        };
        let io: Box<dyn Transport> = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Box::new(tcp(host.clone(), *port).await?),
            ConnectionAddr::TcpTls { host, port, .. } => {
                let Some(tls) = tls else {
                    return Err(format!("{host}:{port} speaks TLS, and no TLS was set up for it"));
                };
                let name = rustls::pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| format!("{host:?} is not a name a TLS certificate can have: {e}"))?;
                let s = tcp(host.clone(), *port).await?;
                Box::new(tls.connect(name, s).await.map_err(|e| {
                    format!(
                        "TLS with {host}:{port} failed: {e} (its certificate is checked against \
                         cluster.redis_ca_file, or the system's roots when that is empty)"
                    )
                })?)
            }
            ConnectionAddr::Unix(path) => Box::new(
                tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", path.display()))?,
            ),
            other => return Err(format!("cannot open a pub/sub link to {other}")),
        };
        let mut conn = Conn {
            io,
            buf: BytesMut::with_capacity(4096),
            max_bulk: MAX_BULK,
            discard: 0,
        };
        let settings = info.redis_settings();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
            conn.write(&auth.get_packed_command())
                .await
                .map_err(|e| e.to_string())?;
            match conn.next().await? {
                Reply::Simple(_) => {}
                Reply::Error(e) => return Err(format!("AUTH refused: {e}")),
                other => return Err(format!("unexpected answer to AUTH: {other:?}")),
            }
        }
        Ok(conn)
    }

    /// Takes bulk strings of at most `max_bulk` bytes from now on (the bus
    /// link: `message.max_bytes` plus [`FRAMING_BYTES`]).
    pub(crate) fn limit(&mut self, max_bulk: usize) {
        self.max_bulk = max_bulk;
    }

    /// Writes one encoded command (or several).
    pub(crate) async fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.io.write_all(bytes).await?;
        // Over TLS, what `write_all` took may still sit in rustls's
        // buffer; a flush sends it (on a plain socket it does nothing).
        self.io.flush().await
    }

    /// The next reply, reading as needed.
    pub(crate) async fn next(&mut self) -> Result<Reply, String> {
        loop {
            if let Some(reply) = self.parsed()? {
                return Ok(reply);
            }
            self.fill().await?;
        }
    }

    /// A reply already in the buffer, if there is one whole.
    pub(crate) fn parsed(&mut self) -> Result<Option<Reply>, String> {
        match parse_reply_within(&self.buf, self.max_bulk)? {
            Some((reply, used)) => {
                let held = self.buf.len();
                if used > held {
                    // An oversized payload: drop what came of it, and the
                    // rest as it comes.
                    self.discard = used - held;
                    self.buf.clear();
                } else {
                    self.buf.advance(used);
                }
                // A large reply grew the buffer: give it back once it is
                // read (one 7 MB message used to keep ~22 MB for good).
                if self.buf.is_empty() && held.max(self.buf.capacity()) > SHRINK_ABOVE {
                    self.buf = BytesMut::with_capacity(4096);
                }
                Ok(Some(reply))
            }
            None => Ok(None),
        }
    }

    /// Reads more bytes into the buffer (cancel-safe: nothing read is lost
    /// if the future is dropped); an end of stream is an error.
    pub(crate) async fn fill(&mut self) -> Result<(), String> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(4096);
        }
        match self.io.read_buf(&mut self.buf).await {
            Ok(0) => Err("Redis closed the pub/sub connection".to_owned()),
            Ok(_) => {
                let dropped = self.discard.min(self.buf.len());
                self.buf.advance(dropped);
                self.discard -= dropped;
                Ok(())
            }
            Err(e) => Err(format!("reading from Redis: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// redis-rs's parse of the same bytes, in our terms.
    fn theirs(v: redis::Value) -> Reply {
        match v {
            redis::Value::Okay => Reply::Simple("OK".to_owned()),
            redis::Value::SimpleString(s) => Reply::Simple(s),
            redis::Value::Int(i) => Reply::Int(i),
            redis::Value::BulkString(b) => Reply::Bulk(Some(Bytes::from(b))),
            redis::Value::Nil => Reply::Bulk(None),
            redis::Value::Array(items) => Reply::Array(Some(items.into_iter().map(theirs).collect())),
            redis::Value::ServerError(e) => Reply::Error(
                format!("{} {}", e.code(), e.details().unwrap_or_default())
                    .trim_end()
                    .to_owned(),
            ),
            other => panic!("not RESP2: {other:?}"),
        }
    }

    fn encode(r: &Reply, out: &mut Vec<u8>) {
        match r {
            Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
            Reply::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Reply::Oversized(_) => unreachable!("the generator makes none"),
            Reply::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    encode(i, out);
                }
            }
        }
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let word = "[A-Za-z][A-Za-z0-9 ]{0,12}";
        let leaf = prop_oneof![
            word.prop_map(|s| Reply::Simple(s.trim_end().to_owned())),
            "ERR [a-z ]{0,12}".prop_map(|s| Reply::Error(s.trim_end().to_owned())),
            any::<i64>().prop_map(Reply::Int),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| Reply::Bulk(Some(Bytes::from(b)))),
            Just(Reply::Bulk(None)),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            proptest::collection::vec(inner, 0..6).prop_map(|v| Reply::Array(Some(v)))
        })
    }

    proptest! {
        /// Whole replies parse as redis-rs parses them, taking every byte;
        /// every proper prefix is "need more", never an error or a reply.
        #[test]
        fn agrees_with_redis_rs(r in reply()) {
            let mut bytes = Vec::new();
            encode(&r, &mut bytes);
            let (ours, used) = parse_reply(&bytes).unwrap().expect("whole reply");
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&ours, &theirs(redis::parse_redis_value(&bytes).unwrap()));
            for cut in 0..bytes.len() {
                prop_assert_eq!(parse_reply(&bytes[..cut]).unwrap(), None);
            }
        }
    }

    #[test]
    fn two_replies_in_one_buffer() {
        let buf =
            b"*3\r\n$9\r\nsubscribe\r\n$3\r\nfoo\r\n:1\r\n*3\r\n$7\r\nmessage\r\n$3\r\nfoo\r\n$2\r\nhi\r\n";
        let (first, used) = parse_reply(buf).unwrap().unwrap();
        assert_eq!(Received::of(first).unwrap(), Received::Subscribed);
        let (second, rest) = parse_reply(&buf[used..]).unwrap().unwrap();
        assert_eq!(used + rest, buf.len());
        assert_eq!(
            Received::of(second).unwrap(),
            Received::Message {
                channel: Bytes::from_static(b"foo"),
                payload: Bytes::from_static(b"hi")
            }
        );
    }

    #[test]
    fn events() {
        let arr = |items: &[&[u8]]| {
            Reply::Array(Some(
                items
                    .iter()
                    .map(|b| Reply::Bulk(Some(Bytes::copy_from_slice(b))))
                    .collect(),
            ))
        };
        assert_eq!(Received::of(arr(&[b"pong", b""])).unwrap(), Received::Pong);
        let mut unsub = arr(&[b"unsubscribe", b"foo"]);
        if let Reply::Array(Some(items)) = &mut unsub {
            items.push(Reply::Int(0));
        }
        assert_eq!(Received::of(unsub).unwrap(), Received::Unsubscribed);
        assert!(
            Received::of(Reply::Error("NOAUTH Authentication required.".into()))
                .unwrap_err()
                .contains("NOAUTH")
        );
        assert!(Received::of(arr(&[b"message", b"foo"])).is_err());
        assert!(Received::of(Reply::Int(1)).is_err());
        // A Redis Cluster's sharded channels.
        assert_eq!(
            Received::of(arr(&[b"smessage", b"sb:id:{a}", b"hi"])).unwrap(),
            Received::Message {
                channel: Bytes::from_static(b"sb:id:{a}"),
                payload: Bytes::from_static(b"hi")
            }
        );
        let mut ssub = arr(&[b"ssubscribe", b"sb:id:{a}"]);
        let mut sunsub = arr(&[b"sunsubscribe", b"sb:id:{a}"]);
        for r in [&mut ssub, &mut sunsub] {
            if let Reply::Array(Some(items)) = r {
                items.push(Reply::Int(0));
            }
        }
        assert_eq!(Received::of(ssub).unwrap(), Received::Subscribed);
        assert_eq!(Received::of(sunsub).unwrap(), Received::Unsubscribed);
        assert!(
            Received::of(Reply::Error("MOVED 16287 127.0.0.1:7001".into()))
                .unwrap_err()
                .contains("MOVED")
        );
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        for bad in [&b"?x\r\n"[..], b":12a\r\n", b"$3\r\nabcd\r\n", b"$9999999999\r\n"] {
            assert!(parse_reply(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse_reply(deep.as_bytes()).is_err());
    }

    /// A link over one end of an in-memory pipe, taking `max_bulk`.
    fn piped(max_bulk: usize) -> (Conn, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let mut conn = Conn {
            io: Box::new(ours),
            buf: BytesMut::with_capacity(4096),
            max_bulk,
            discard: 0,
        };
        conn.limit(max_bulk);
        (conn, theirs)
    }

    fn message(channel: &str, payload: &[u8]) -> Vec<u8> {
        let mut m = format!(
            "*3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n${}\r\n",
            channel.len(),
            payload.len()
        )
        .into_bytes();
        m.extend(payload);
        m.extend(b"\r\n");
        m
    }

    /// A bus message past the link's limit is known by its length line and
    /// dropped as its bytes come, never buffered; the next message is read
    /// whole (issue 40: bulk strings up to 512 MB were buffered).
    #[tokio::test]
    async fn an_oversized_payload_is_dropped_as_it_arrives() {
        let (mut conn, mut redis) = piped(100);
        let mut wire = message("sb:id:a", &[b'x'; 200_000]);
        wire.extend(message("sb:id:a", b"n@1 fine"));
        let writer = tokio::spawn(async move {
            for chunk in wire.chunks(3000) {
                redis.write_all(chunk).await.unwrap();
                tokio::task::yield_now().await;
            }
            redis
        });
        let mut most = 0;
        let first = loop {
            if let Some(r) = conn.parsed().unwrap() {
                break r;
            }
            conn.fill().await.unwrap();
            most = most.max(conn.buf.capacity());
        };
        assert_eq!(
            Received::of(first).unwrap(),
            Received::Oversized {
                channel: Bytes::from_static(b"sb:id:a"),
                bytes: 200_000
            }
        );
        let second = loop {
            if let Some(r) = conn.parsed().unwrap() {
                break r;
            }
            conn.fill().await.unwrap();
            most = most.max(conn.buf.capacity());
        };
        assert!(
            matches!(Received::of(second).unwrap(), Received::Message { payload, .. } if &payload[..] == b"n@1 fine")
        );
        assert!(most <= 16 * 1024, "the buffer grew to {most} bytes");
        drop(writer.await.unwrap());
        // Not the last element of a message: an error, not a panic.
        assert!(parse_reply_within(b"*2\r\n$500\r\n", 100).is_err());
        assert!(parse_reply_within(b"$500\r\n", 100).is_err());
    }

    /// After a large message the link's buffer goes back to its start size.
    #[tokio::test]
    async fn the_buffer_shrinks_after_a_large_message() {
        let (mut conn, mut redis) = piped(8 << 20);
        let writer = tokio::spawn(async move {
            redis
                .write_all(&message("sb:id:a", &[b'y'; 3 << 20]))
                .await
                .unwrap();
            redis
        });
        let reply = conn.next().await.unwrap();
        drop(writer.await.unwrap());
        assert!(
            matches!(Received::of(reply).unwrap(), Received::Message { payload, .. } if payload.len() == 3 << 20)
        );
        assert!(conn.buf.capacity() <= 4096, "{}", conn.buf.capacity());
    }
}
