//! An incremental parser for one long-lived streaming response: status line,
//! headers, then events — chunks of a chunked body, or lines of a raw body
//! (Nchan's `http-raw-stream`, HTTP/1.0). It keeps a few bytes of state per
//! connection and never buffers a whole event: only its first
//! [`CAPTURE`] bytes, enough to find a message's send timestamp.

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
    /// Final chunk seen.
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
}

impl Default for EventParser {
    fn default() -> Self {
        EventParser {
            state: State::Status { spaces: 0 },
            num: 0,
            chunked_match: 0,
            chunked: false,
            cap: [0; CAPTURE],
            cap_len: 0,
        }
    }
}

impl EventParser {
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
                        if self.num != 200 {
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
                        if self.chunked {
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
                State::Done => return Ok(Fed::Ended),
            }
        }
        Ok(Fed::More)
    }

    fn capture(&mut self, bytes: &[u8]) {
        let at = self.cap_len as usize;
        let n = bytes.len().min(CAPTURE - at);
        self.cap[at..at + n].copy_from_slice(&bytes[..n]);
        self.cap_len += n as u8;
    }
}

/// The send timestamp a message carries: the digits after `@`, microseconds
/// since the Unix epoch.
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
    }
}
