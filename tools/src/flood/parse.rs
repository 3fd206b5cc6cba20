//! An incremental parser for one long-lived streaming response: status line,
//! headers, then events — chunks of a chunked body, or lines of a raw body
//! (Nchan's `http-raw-stream`, HTTP/1.0), or the text frames of a WebSocket
//! (`--transport ws`, after a `101`). With `--transport sse` an event is a
//! chunk too, and what is inspected is its `data:` line. It keeps a few
//! bytes of state per connection and never buffers a whole event: only its
//! first [`CAPTURE`] bytes, enough to find a message's send timestamp.

use super::Transport;
use crate::http::head_end_step;

/// Bytes of each event kept for inspection.
pub(super) const CAPTURE: usize = 48;

/// What a parser saw in one `feed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fed {
    /// More bytes are welcome.
    More,
    /// The body ended (final chunk).
    Ended,
}

/// The response is not a stream we can count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ParseError {
    /// Status other than 200 (0 if the status line was unreadable).
    Status(u16),
    /// Broken chunk framing.
    Framing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the status line; `num` collects the code.
    Status { spaces: u8 },
    /// In the headers; `matched` counts the "\r\n\r\n" seen so far.
    Headers { matched: u8 },
    /// Reading a chunk-size line.
    Size { ext: bool },
    /// Inside chunk data; `num` bytes left.
    Data,
    /// After chunk data, before its CRLF.
    DataEnd,
    /// Raw body: inside a line.
    Line,
    /// WebSocket frame header: `step` 0 is the opcode byte, 1 the length
    /// byte, then the extended length bytes left (counting down from 10).
    WsHead { step: u8 },
    /// Final chunk (or close frame) seen.
    Done,
}

/// Parser state for one connection (about 70 bytes).
#[derive(Debug, Clone)]
pub(super) struct EventParser {
    state: State,
    /// Status code, chunk size, or bytes left in a chunk.
    num: u64,
    /// How much of "chunked" the headers have matched (case-insensitive).
    chunked_match: u8,
    /// The headers said `chunked`.
    chunked: bool,
    /// First bytes of the current event.
    cap: [u8; CAPTURE],
    /// How many of `cap` are filled.
    cap_len: u8,
    /// The transport read.
    transport: Transport,
    /// SSE: how much of `data: ` this event has matched (6: capturing).
    /// WebSocket: the current frame's opcode.
    aux: u8,
}

impl Default for EventParser {
    fn default() -> Self {
        EventParser::new(Transport::Chunked)
    }
}

/// What an SSE event's text follows.
const SSE_DATA: &[u8] = b"data: ";

impl EventParser {
    /// A parser for a response of this transport.
    pub(super) fn new(transport: Transport) -> Self {
        EventParser {
            state: State::Status { spaces: 0 },
            num: 0,
            chunked_match: 0,
            chunked: false,
            cap: [0; CAPTURE],
            cap_len: 0,
            transport,
            aux: 0,
        }
    }

    /// True once the head was read and was `200`.
    pub(super) fn in_body(&self) -> bool {
        !matches!(self.state, State::Status { .. } | State::Headers { .. })
    }

    /// Consumes `data`; calls `on_event` with the captured start of every
    /// complete event (a chunk, or a line of a raw body, without its `\n`).
    pub(super) fn feed(&mut self, data: &[u8], mut on_event: impl FnMut(&[u8])) -> Result<Fed, ParseError> {
        let mut i = 0;
        while i < data.len() {
            let b = data[i];
            match self.state {
                State::Status { spaces } => {
                    if b == b'\n' {
                        let expected = if self.transport == Transport::Ws { 101 } else { 200 };
                        if self.num != expected {
                            return Err(ParseError::Status(self.num as u16));
                        }
                        self.state = State::Headers { matched: 2 };
                    } else if b == b' ' {
                        self.state = State::Status {
                            spaces: spaces.saturating_add(1),
                        };
                    } else if spaces == 1 && b.is_ascii_digit() && self.num < 1000 {
                        self.num = self.num * 10 + u64::from(b - b'0');
                    }
                    i += 1;
                }
                State::Headers { matched } => {
                    const CHUNKED: &[u8] = b"chunked";
                    if b.eq_ignore_ascii_case(&CHUNKED[self.chunked_match as usize]) {
                        self.chunked_match += 1;
                        if self.chunked_match as usize == CHUNKED.len() {
                            self.chunked = true;
                            self.chunked_match = 0;
                        }
                    } else {
                        self.chunked_match = u8::from(b.eq_ignore_ascii_case(&CHUNKED[0]));
                    }
                    let matched = head_end_step(matched, b);
                    self.state = if matched == 4 {
                        self.num = 0;
                        self.cap_len = 0;
                        self.aux = 0;
                        if self.transport == Transport::Ws {
                            State::WsHead { step: 0 }
                        } else if self.chunked {
                            State::Size { ext: false }
                        } else {
                            State::Line
                        }
                    } else {
                        State::Headers { matched }
                    };
                    i += 1;
                }
                State::Size { ext } => {
                    match b {
                        b'\n' if self.num == 0 => {
                            self.state = State::Done;
                            return Ok(Fed::Ended);
                        }
                        b'\n' => {
                            self.cap_len = 0;
                            self.aux = 0;
                            self.state = State::Data;
                        }
                        b'\r' => {}
                        b';' => self.state = State::Size { ext: true },
                        _ if ext => {}
                        _ => {
                            let d = (b as char).to_digit(16).ok_or(ParseError::Framing)?;
                            if self.num > u64::MAX >> 8 {
                                return Err(ParseError::Framing);
                            }
                            self.num = self.num * 16 + u64::from(d);
                        }
                    }
                    i += 1;
                }
                State::Data => {
                    let take = (data.len() - i).min(usize::try_from(self.num).unwrap_or(usize::MAX));
                    self.capture(&data[i..i + take]);
                    self.num -= take as u64;
                    i += take;
                    if self.num == 0 {
                        if self.transport == Transport::Ws {
                            if self.ws_frame_done(&mut on_event) {
                                return Ok(Fed::Ended);
                            }
                            continue;
                        }
                        let cap = &self.cap[..self.cap_len as usize];
                        on_event(cap.strip_suffix(b"\n").unwrap_or(cap));
                        self.state = State::DataEnd;
                    }
                }
                State::DataEnd => {
                    match b {
                        b'\r' => {}
                        b'\n' => self.state = State::Size { ext: false },
                        _ => return Err(ParseError::Framing),
                    }
                    i += 1;
                }
                State::Line => {
                    let end = data[i..].iter().position(|&c| c == b'\n');
                    let take = end.unwrap_or(data.len() - i);
                    self.capture(&data[i..i + take]);
                    i += take;
                    if end.is_some() {
                        i += 1;
                        on_event(&self.cap[..self.cap_len as usize]);
                        self.cap_len = 0;
                    }
                }
                State::WsHead { step } => {
                    i += 1;
                    match step {
                        0 => {
                            self.aux = b & 0x0f;
                            self.state = State::WsHead { step: 1 };
                            continue;
                        }
                        1 => {
                            self.num = u64::from(b & 0x7f);
                            self.state = match self.num {
                                126 => State::WsHead { step: 10 - 2 },
                                127 => State::WsHead { step: 10 - 8 },
                                _ => State::Data,
                            };
                            if self.num >= 126 {
                                self.num = 0;
                            }
                        }
                        _ => {
                            // `step` counts the extended length bytes up to 10.
                            self.num = (self.num << 8) | u64::from(b);
                            self.state = if step == 9 {
                                State::Data
                            } else {
                                State::WsHead { step: step + 1 }
                            };
                        }
                    }
                    if self.state == State::Data {
                        self.cap_len = 0;
                        if self.num == 0 && self.ws_frame_done(&mut on_event) {
                            return Ok(Fed::Ended);
                        }
                    }
                }
                State::Done => return Ok(Fed::Ended),
            }
        }
        Ok(Fed::More)
    }

    /// A WebSocket frame's payload is complete: a text frame is an event,
    /// a close frame ends the stream (true).
    fn ws_frame_done(&mut self, on_event: &mut impl FnMut(&[u8])) -> bool {
        match self.aux {
            0x1 => on_event(&self.cap[..self.cap_len as usize]),
            0x8 => {
                self.state = State::Done;
                return true;
            }
            _ => {}
        }
        self.state = State::WsHead { step: 0 };
        false
    }

    fn capture(&mut self, mut bytes: &[u8]) {
        if self.transport == Transport::Sse {
            // Only the data line's text: skip `id:`, `event:` and the
            // `data: ` prefix.
            while (self.aux as usize) < SSE_DATA.len() {
                let Some((&b, rest)) = bytes.split_first() else {
                    return;
                };
                bytes = rest;
                self.aux = if b == SSE_DATA[self.aux as usize] {
                    self.aux + 1
                } else {
                    u8::from(b == SSE_DATA[0])
                };
            }
        }
        let at = self.cap_len as usize;
        let n = bytes.len().min(CAPTURE - at);
        self.cap[at..at + n].copy_from_slice(&bytes[..n]);
        self.cap_len += n as u8;
    }
}

/// The send timestamp a message carries: the digits after `@`, microseconds
/// since the Unix epoch.
/// The send time of a broadcast probe, `Recvd msg #N: 'B@<µs>'`: what
/// `/broadcast` carries in a run that times one (scripts/c1m.sh, `bench
/// broadcast`); on a peer's raw stream (Nchan) the event is the probe
/// itself, `B@<µs>`. Checked before [`stamp_of`], which would read it as a
/// routed message.
pub(super) fn broadcast_stamp_of(event: &[u8]) -> Option<u64> {
    if event.starts_with(b"B@") {
        return stamp_of(event);
    }
    let at = event.windows(3).position(|w| w == b"'B@")?;
    stamp_of(&event[at + 1..])
}

pub(super) fn stamp_of(event: &[u8]) -> Option<u64> {
    let at = event.iter().position(|&b| b == b'@')?;
    let digits = &event[at + 1..];
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};

    use super::*;

    fn events(input: &[&[u8]]) -> (Vec<String>, Result<Fed, ParseError>) {
        let mut p = EventParser::default();
        let mut out = Vec::new();
        let mut last = Ok(Fed::More);
        for part in input {
            last = p.feed(part, |e| out.push(String::from_utf8_lossy(e).into_owned()));
            if last != Ok(Fed::More) {
                break;
            }
        }
        (out, last)
    }

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n";

    #[test]
    fn chunks_in_any_split() {
        let body = b"5\r\nhello\r\n7\r\nChunk 1\r\n0\r\n\r\n";
        let whole = [HEAD, body].concat();
        for split in 0..whole.len() {
            let (ev, last) = events(&[&whole[..split], &whole[split..]]);
            assert_eq!(ev, vec!["hello", "Chunk 1"], "split at {split}");
            assert_eq!(last, Ok(Fed::Ended));
        }
    }

    fn feed_all(mut p: EventParser, input: &[u8], bytewise: bool) -> (Vec<String>, Result<Fed, ParseError>) {
        let mut got = Vec::new();
        let mut last = Ok(Fed::More);
        let pieces: Vec<&[u8]> = if bytewise {
            input.chunks(1).collect()
        } else {
            vec![input]
        };
        for piece in pieces {
            last = p.feed(piece, |e| got.push(String::from_utf8_lossy(e).into_owned()));
            if last != Ok(Fed::More) {
                break;
            }
        }
        (got, last)
    }

    #[test]
    fn sse_events_are_read_by_their_data_line() {
        let mut body =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                .to_vec();
        for event in [
            "retry: 2000\n\n",
            "id: 17\nevent: welcome\ndata: Switchboard welcomes you! x\n\n",
            "id: 1796145112131677\nevent: message\ndata: Recvd msg #2: '@123'\n\n",
        ] {
            body.extend(format!("{:x}\r\n{event}\r\n", event.len()).into_bytes());
        }
        body.extend(b"0\r\n\r\n");
        let body = &body[..];
        for bytewise in [false, true] {
            let (got, end) = feed_all(EventParser::new(Transport::Sse), body, bytewise);
            assert_eq!(end, Ok(Fed::Ended));
            assert_eq!(
                got,
                ["", "Switchboard welcomes you! x\n", "Recvd msg #2: '@123'\n"]
            );
            // The welcome starts the tick clock as on a plain stream.
            assert!(got[1].starts_with("Switchboard welcomes you!"));
            assert_eq!(stamp_of(got[2].as_bytes()), Some(123));
        }
    }

    #[test]
    fn websocket_text_frames_are_events_and_close_ends() {
        let mut body = b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n".to_vec();
        body.extend([0x81, 5]);
        body.extend(b"hello");
        body.extend([0x8a, 0]); // a pong: not an event
        let long = vec![b'x'; 300];
        body.extend([0x81, 126, 1, 44]);
        body.extend(&long);
        body.extend([0x81, 127, 0, 0, 0, 0, 0, 0, 0, 2]);
        body.extend(b"@9");
        body.extend([0x88, 2, 0x03, 0xe9]);
        for bytewise in [false, true] {
            let (got, end) = feed_all(EventParser::new(Transport::Ws), &body, bytewise);
            assert_eq!(end, Ok(Fed::Ended));
            assert_eq!(got.len(), 3, "{got:?}");
            assert_eq!(got[0], "hello");
            assert_eq!(got[1].len(), CAPTURE);
            assert_eq!(got[2], "@9");
        }
        let (_, end) = feed_all(EventParser::new(Transport::Ws), b"HTTP/1.1 200 OK\r\n\r\n", false);
        assert_eq!(end, Err(ParseError::Status(200)), "a WebSocket needs a 101");
    }

    #[test]
    fn raw_lines_and_status() {
        let (ev, last) = events(&[b"HTTP/1.1 200 OK\r\n\r\nab\ncd\n"]);
        assert_eq!(
            (ev, last),
            (vec!["ab".to_owned(), "cd".to_owned()], Ok(Fed::More))
        );
        let (_, last) = events(&[b"HTTP/1.1 503 Service Unavailable\r\n\r\n"]);
        assert_eq!(last, Err(ParseError::Status(503)));
        let (_, last) = events(&[HEAD, b"zz\r\n"]);
        assert_eq!(last, Err(ParseError::Framing));
    }

    #[test]
    fn long_events_are_captured_partly_and_stamps_found() {
        let line = format!("Recvd msg #12: '@1764482400123456' {}\n", "x".repeat(100));
        let body = format!("{:x}\r\n{line}\r\n", line.len());
        let mut stamp = None;
        let mut p = EventParser::default();
        p.feed(HEAD, |_| {}).unwrap();
        p.feed(body.as_bytes(), |e| stamp = stamp_of(e)).unwrap();
        assert_eq!(stamp, Some(1_764_482_400_123_456));
        assert_eq!(stamp_of(b"Chunk 1 for id x"), None);
        assert_eq!(
            broadcast_stamp_of(b"Recvd msg #3: 'B@1764482400123456'"),
            Some(1_764_482_400_123_456)
        );
        assert_eq!(broadcast_stamp_of(b"Recvd msg #3: '@1764482400123456'"), None);
        // A peer's raw stream carries the probe as it was sent.
        assert_eq!(
            broadcast_stamp_of(b"B@1764482400123456"),
            Some(1_764_482_400_123_456)
        );
        assert_eq!(broadcast_stamp_of(b"@1764482400123456"), None);
    }

    /// 10,000 cases each; `PROPTEST_CASES=1000000 cargo test -p switchboard-tools --lib` for a longer run.
    fn config() -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000);
        ProptestConfig {
            cases,
            ..ProptestConfig::default()
        }
    }

    /// What feeding a fresh parser gave: the events (captured bytes), the result that stopped it
    /// (first `Err` or `Ended`, else the last `Ok(More)`), and the parser as it was left.
    type Outcome = (Vec<Vec<u8>>, Result<Fed, ParseError>, EventParser);

    /// Feeds `pieces` in order to a fresh parser, stopping at the first result other than `Ok(More)`.
    fn run(pieces: &[&[u8]]) -> Outcome {
        let mut p = EventParser::default();
        let mut out = Vec::new();
        let mut last = Ok(Fed::More);
        for piece in pieces {
            last = p.feed(piece, |e| out.push(e.to_vec()));
            if last != Ok(Fed::More) {
                break;
            }
        }
        (out, last, p)
    }

    /// Cuts `input` at `cuts` (taken modulo its length + 1, any order; repeats give empty pieces,
    /// which are fed too).
    fn split<'a>(input: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        at.sort_unstable();
        let mut pieces = Vec::with_capacity(at.len() + 1);
        let mut from = 0;
        for to in at {
            pieces.push(&input[from..to]);
            from = to;
        }
        pieces.push(&input[from..]);
        pieces
    }

    /// Asserts two outcomes are the same: events, stopping result, and parser state.
    fn same(got: &Outcome, want: &Outcome, how: &str) -> Result<(), TestCaseError> {
        prop_assert_eq!(&got.0, &want.0, "events differ when fed {}", how);
        prop_assert_eq!(got.1, want.1, "result differs when fed {}", how);
        // Both stopped after the same byte, so the state must match too.
        prop_assert_eq!(
            format!("{:?}", got.2),
            format!("{:?}", want.2),
            "state differs when fed {}",
            how
        );
        Ok(())
    }

    /// Where `needle` first occurs in `hay`.
    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// Reference decoder for a whole chunked response, written for clarity, not speed and
    /// independently of the parser: find the head's end, then loop over hex size line (extensions
    /// after `;` ignored), data, CRLF. Gives the first [`CAPTURE`] bytes of each chunk without its
    /// trailing `\n`, and whether the final (zero) chunk came.
    fn reference_chunked(input: &[u8]) -> (Vec<Vec<u8>>, bool) {
        let mut at = find(input, b"\r\n\r\n").expect("no end of head") + 4;
        let mut events = Vec::new();
        loop {
            let Some(eol) = find(&input[at..], b"\r\n") else {
                return (events, false);
            };
            let hex = input[at..at + eol].split(|&b| b == b';').next().unwrap_or(&[]);
            let size = usize::from_str_radix(std::str::from_utf8(hex).expect("size not UTF-8"), 16)
                .expect("size not hex");
            at += eol + 2;
            if size == 0 {
                return (events, true);
            }
            let Some(data) = input.get(at..at + size) else {
                return (events, false);
            };
            let event = data.strip_suffix(b"\n").unwrap_or(data);
            events.push(event[..event.len().min(CAPTURE)].to_vec());
            assert_eq!(
                input.get(at + size..at + size + 2),
                Some(&b"\r\n"[..]),
                "no CRLF after data"
            );
            at += size + 2;
        }
    }

    /// One line of event text, no CR or LF: printable ASCII, or any non-control Unicode (so that
    /// [`CAPTURE`] may cut a character in two).
    fn text() -> impl Strategy<Value = String> {
        let ascii = vec(b' '..=b'~', 0..100).prop_map(|b| b.into_iter().map(char::from).collect());
        let any = vec(
            any::<char>().prop_map(|c| if c.is_control() { '?' } else { c }),
            0..60,
        )
        .prop_map(|c| c.into_iter().collect());
        prop_oneof![ascii, any]
    }

    /// A header line that is not transfer-encoding: `Name: value\r\n`, no CR or LF inside.
    fn header() -> impl Strategy<Value = String> {
        const NAME: &[u8] = b"ABCXYZabcxyz0189-";
        let name = (select(&NAME[..12]), vec(select(NAME), 0..16));
        (name, vec(b' '..=b'~', 0..40)).prop_map(|((first, rest), value)| {
            let line = [&[first], &rest[..], b": ", &value[..], b"\r\n"].concat();
            String::from_utf8(line).expect("ASCII")
        })
    }

    /// One framed chunk holding one line of [`text`] ending in `\n`; its size line in hex of
    /// either case, maybe with leading zeros, maybe with an extension.
    fn chunk() -> impl Strategy<Value = Vec<u8>> {
        let ext = proptest::option::of(vec(b' '..=b'~', 0..10));
        (text(), any::<bool>(), 0..3usize, ext).prop_map(|(text, upper, zeros, ext)| {
            let size = text.len() + 1;
            let hex = if upper {
                format!("{size:X}")
            } else {
                format!("{size:x}")
            };
            let ext = ext.map(|e| [&b";"[..], &e].concat()).unwrap_or_default();
            let size_line = [&"0".repeat(zeros).into_bytes(), hex.as_bytes(), &ext, b"\r\n"].concat();
            [size_line, text.into_bytes(), b"\n\r\n".to_vec()].concat()
        })
    }

    /// A valid chunked streaming response: `HTTP/1.1 200 OK`, a few headers with
    /// `transfer-encoding: chunked` (any case) among them, up to 20 chunks, then maybe the final
    /// chunk, maybe followed by bytes the parser must not look at.
    fn chunked_response() -> impl Strategy<Value = Vec<u8>> {
        let head = (vec(header(), 0..5), any::<Index>(), any::<u32>()).prop_map(|(mut headers, at, case)| {
            let te: String = "transfer-encoding: chunked"
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if (case >> i) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            headers.insert(at.index(headers.len() + 1), format!("{te}\r\n"));
            format!("HTTP/1.1 200 OK\r\n{}\r\n", headers.concat())
        });
        let end = proptest::option::of((0..3usize, vec(any::<u8>(), 0..16)));
        (head, vec(chunk(), 0..20), end).prop_map(|(head, chunks, end)| {
            let mut out = head.into_bytes();
            out.extend(chunks.concat());
            if let Some((zeros, after)) = end {
                out.extend(format!("{}0\r\n\r\n", "0".repeat(zeros)).into_bytes());
                out.extend(after);
            }
            out
        })
    }

    /// Bytes that steer the parser through its states: head, size-line and framing characters.
    const INTERESTING: &[u8] = b"\r\n\r\n0123456789abcdefABCDEF;: chunkedCHUNKED HTTP/1.1 200 OK@";

    /// Input to throw at the parser: either an optional valid head (chunked or raw) followed by
    /// bytes that are anything or [`INTERESTING`], or a valid chunked response with a few bytes
    /// overwritten and maybe cut short.
    fn noise() -> impl Strategy<Value = Vec<u8>> {
        let head = select(vec![
            &b""[..],
            HEAD,
            b"HTTP/1.0 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
        ]);
        // Bytes as they are, all mapped into INTERESTING, or those with the high bit set mapped.
        let garbage = (head, 0..3u8, vec(any::<u8>(), 0..2048)).prop_map(|(h, mode, mut b)| {
            for b in b.iter_mut().filter(|b| mode == 1 || (mode == 2 && **b >= 0x80)) {
                *b = INTERESTING[usize::from(*b) % INTERESTING.len()];
            }
            [h, &b[..]].concat()
        });
        let edits = vec((any::<Index>(), any::<u8>()), 0..4);
        let mutated = (chunked_response(), edits, proptest::option::of(any::<Index>())).prop_map(
            |(mut r, edits, cut)| {
                for (at, b) in edits {
                    let at = at.index(r.len());
                    r[at] = b;
                }
                if let Some(cut) = cut {
                    r.truncate(cut.index(r.len() + 1));
                }
                r
            },
        );
        prop_oneof![garbage, mutated]
    }

    proptest! {
        #![proptest_config(config())]

        /// Never panics, and the split does not matter: whole, in arbitrary pieces, or byte by
        /// byte, the events, the first `Err`/`Ended` (or final `More`) and the state agree; after
        /// `Ended` the parser stays ended.
        #[test]
        fn any_bytes_any_split_same_outcome(input in noise(), cuts in vec(any::<Index>(), 0..16)) {
            let whole = run(&[&input]);
            same(&run(&split(&input, &cuts)), &whole, "in pieces")?;
            same(&run(&input.chunks(1).collect::<Vec<_>>()), &whole, "byte by byte")?;
            let (_, result, mut parser) = whole;
            if result == Ok(Fed::Ended) {
                let mut events = 0;
                prop_assert_eq!(parser.feed(&input, |_| events += 1), Ok(Fed::Ended));
                prop_assert_eq!(events, 0);
            }
        }

        /// A valid chunked response, split anywhere, gives exactly the reference decoder's events
        /// (their first `CAPTURE` bytes), and `Ended` iff it had the final chunk.
        #[test]
        fn chunked_response_matches_reference(
            input in chunked_response(),
            cuts in vec(any::<Index>(), 0..16),
        ) {
            let (want, ended) = reference_chunked(&input);
            let (events, result, parser) = run(&split(&input, &cuts));
            prop_assert_eq!(events, want);
            prop_assert_eq!(result, Ok(if ended { Fed::Ended } else { Fed::More }));
            prop_assert!(parser.in_body());
        }

        /// A raw (not chunked) body, split anywhere, gives one event per complete line: its first
        /// `CAPTURE` bytes, without the `\n`; a trailing partial line gives none.
        #[test]
        fn raw_lines_match_reference(
            version in select(vec!["HTTP/1.0", "HTTP/1.1"]),
            headers in vec(header(), 0..5)
                .prop_filter("no chunked", |h| !h.concat().to_ascii_lowercase().contains("chunked")),
            lines in vec(text(), 0..20),
            partial in text(),
            cuts in vec(any::<Index>(), 0..16),
        ) {
            let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
            let input = format!("{version} 200 OK\r\n{}\r\n{body}{partial}", headers.concat());
            let want: Vec<Vec<u8>> =
                lines.iter().map(|l| l.as_bytes()[..l.len().min(CAPTURE)].to_vec()).collect();
            let (events, result, parser) = run(&split(input.as_bytes(), &cuts));
            prop_assert_eq!(events, want);
            prop_assert_eq!(result, Ok(Fed::More));
            prop_assert!(parser.in_body());
        }

        /// Any status but 200 is `Status(code)`, whatever follows and however it is split, with no
        /// events and the parser still before the body.
        #[test]
        fn non_200_status_is_an_error(
            version in select(vec!["HTTP/1.0", "HTTP/1.1"]),
            code in (0u16..10_000).prop_filter("not 200", |c| *c != 200),
            reason in prop_oneof![Just(String::new()), "[ -~]{0,20}".prop_map(|r| format!(" {r}"))],
            rest in vec(any::<u8>(), 0..256),
            cuts in vec(any::<Index>(), 0..16),
        ) {
            let input = [format!("{version} {code}{reason}\r\n").as_bytes(), &rest].concat();
            let (events, result, parser) = run(&split(&input, &cuts));
            prop_assert_eq!(result, Err(ParseError::Status(code)));
            prop_assert!(events.is_empty());
            prop_assert!(!parser.in_body());
        }

        /// `stamp_of` finds the digits after the first `@`, however much text surrounds them.
        #[test]
        fn stamp_after_at(prefix in "[^@]{0,30}", stamp in any::<u64>(), suffix in "([^0-9@][^@]{0,20})?") {
            prop_assert_eq!(stamp_of(format!("{prefix}@{stamp}{suffix}").as_bytes()), Some(stamp));
            prop_assert_eq!(stamp_of(format!("{prefix}{suffix}").as_bytes()), None);
        }
    }
}
