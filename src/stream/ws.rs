//! The WebSocket side of a stream: frames out, and what a client may send in.
//!
//! Frame headers, both ways, are tungstenite's ([`FrameHeader::parse`] and
//! [`FrameHeader::format`]); the frames go through the Stream's own socket,
//! not a tungstenite `WebSocket`, whose read and write buffers would cost
//! every idle stream (the lean path's whole point). What is left here is
//! the policy of a stream that only sends:
//!
//! - a ping is answered with a pong carrying its payload;
//! - a close is answered with a close (its code echoed) and ends the stream;
//!   a close with a code no endpoint may send is answered 1002, one whose
//!   reason is not UTF-8, 1007 (RFC 6455 §7.4, §8.1);
//! - text and binary messages are read past and counted, never buffered;
//! - a frame larger than [`MAX_CLIENT_FRAME`] ends the stream with 1009; an
//!   unmasked frame, reserved bits or opcodes, a fragmented or oversized
//!   control frame, or a continuation out of place, with 1002.
//!
//! An idle WebSocket holds no [`Inbox`]: one exists only while a frame is
//! half read.

use std::io::Cursor;

use tungstenite::protocol::frame::FrameHeader;
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};

/// Largest frame a client may send (it is read past, not kept).
pub(crate) const MAX_CLIENT_FRAME: u64 = 4096;

/// Largest control frame payload (RFC 6455 §5.5).
const MAX_CONTROL: u64 = 125;

/// Close codes used here (RFC 6455 §7.4.1).
pub(crate) const GOING_AWAY: u16 = 1001;
/// A frame broke the protocol.
pub(crate) const PROTOCOL_ERROR: u16 = 1002;
/// Policy violation (the stream's token expired).
pub(crate) const POLICY: u16 = 1008;
/// A frame was too big.
pub(crate) const TOO_BIG: u16 = 1009;
/// Text that is not UTF-8.
pub(crate) const INVALID_DATA: u16 = 1007;

/// True for the close codes an endpoint may send (RFC 6455 §7.4.1 and
/// IANA's registry: 1000-1003, 1007-1014, and 3000-4999 for libraries and
/// applications). 1004-1006 and 1015 are reserved, the rest unassigned.
pub(crate) fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

/// What the client's bytes call for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Answer a ping with this payload.
    Pong(Vec<u8>),
    /// A data message was read past.
    Ignored,
    /// The client closed with this code (1005: none given).
    Close(u16),
    /// Close with this code and reason: the client broke the rules.
    Fail(u16, &'static str),
}

/// A client frame being read.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Bytes of a frame header, or of a control frame, not complete yet.
    buf: Vec<u8>,
    /// Payload bytes of a data frame still to read past.
    skip: u64,
    /// A fragmented data message is open (its continuations are due).
    in_message: bool,
}

impl Inbox {
    /// True when nothing is half read: the inbox can go.
    pub(crate) fn is_idle(&self) -> bool {
        self.buf.is_empty() && self.skip == 0 && !self.in_message
    }

    /// Reads `bytes`; appends what they call for to `out`. Stops at the
    /// first [`Action::Close`] or [`Action::Fail`].
    pub(crate) fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Action>) {
        loop {
            if self.skip > 0 {
                let k = usize::try_from(self.skip).unwrap_or(usize::MAX).min(bytes.len());
                self.skip -= k as u64;
                bytes = &bytes[k..];
                if self.skip > 0 {
                    return;
                }
            }
            self.buf.extend_from_slice(bytes);
            bytes = &[];
            if self.buf.is_empty() {
                self.buf = Vec::new();
                return;
            }
            let mut cursor = Cursor::new(&self.buf[..]);
            let (header, len) = match FrameHeader::parse(&mut cursor) {
                Ok(Some(h)) => h,
                Ok(None) => return,
                Err(_) => return out.push(Action::Fail(PROTOCOL_ERROR, "malformed frame")),
            };
            let start = cursor.position() as usize;
            let Some(mask) = header.mask else {
                return out.push(Action::Fail(PROTOCOL_ERROR, "client frames must be masked"));
            };
            if header.rsv1 || header.rsv2 || header.rsv3 {
                return out.push(Action::Fail(PROTOCOL_ERROR, "reserved bits set"));
            }
            match header.opcode {
                OpCode::Data(Data::Text | Data::Binary | Data::Continue) => {
                    if len > MAX_CLIENT_FRAME {
                        return out.push(Action::Fail(TOO_BIG, "frame too big"));
                    }
                    let continuation = header.opcode == OpCode::Data(Data::Continue);
                    if continuation != self.in_message {
                        return out.push(Action::Fail(PROTOCOL_ERROR, "continuation out of place"));
                    }
                    self.in_message = !header.is_final;
                    if header.is_final {
                        out.push(Action::Ignored);
                    }
                    let have = (self.buf.len() - start) as u64;
                    let take = have.min(len);
                    self.skip = len - take;
                    // What follows this frame's bytes is the next frame.
                    let rest = self.buf.split_off(start + take as usize);
                    self.buf = Vec::new();
                    if rest.is_empty() {
                        continue;
                    }
                    self.buf = rest;
                }
                OpCode::Control(c @ (Control::Ping | Control::Pong | Control::Close)) => {
                    if !header.is_final || len > MAX_CONTROL {
                        return out.push(Action::Fail(PROTOCOL_ERROR, "bad control frame"));
                    }
                    let end = start + len as usize;
                    if self.buf.len() < end {
                        return;
                    }
                    let mut payload = self.buf[start..end].to_vec();
                    // RFC 6455 §5.3 unmasking (tungstenite keeps its own private).
                    for (i, b) in payload.iter_mut().enumerate() {
                        *b ^= mask[i % 4];
                    }
                    self.buf.drain(..end);
                    match c {
                        Control::Ping => out.push(Action::Pong(payload)),
                        Control::Pong => {}
                        _ => {
                            let code = match payload.as_slice() {
                                // No code: RFC 6455 §7.1.5 reads it as 1005.
                                [] => return out.push(Action::Close(1005)),
                                [a, b, ..] => u16::from_be_bytes([*a, *b]),
                                [_] => return out.push(Action::Fail(PROTOCOL_ERROR, "bad close frame")),
                            };
                            if !sendable(code) {
                                return out.push(Action::Fail(PROTOCOL_ERROR, "invalid close code"));
                            }
                            if std::str::from_utf8(payload.get(2..).unwrap_or_default()).is_err() {
                                return out.push(Action::Fail(INVALID_DATA, "close reason is not UTF-8"));
                            }
                            return out.push(Action::Close(code));
                        }
                    }
                }
                _ => return out.push(Action::Fail(PROTOCOL_ERROR, "reserved opcode")),
            }
        }
    }
}

/// Writes the header of a server (unmasked) frame with a `len`-byte
/// payload into `buf`; returns its length (at most 10).
pub(crate) fn header(opcode: OpCode, len: usize, buf: &mut [u8; 10]) -> usize {
    let h = FrameHeader {
        opcode,
        ..FrameHeader::default()
    };
    let mut cursor = Cursor::new(&mut buf[..]);
    // unwrap: a server frame header is at most 10 bytes.
    h.format(len as u64, &mut cursor).expect("frame header fits");
    cursor.position() as usize
}

/// The opcode of a text frame.
pub(crate) const TEXT: OpCode = OpCode::Data(Data::Text);

/// A whole control frame.
pub(crate) fn control(c: Control, payload: &[u8]) -> Vec<u8> {
    let mut head = [0u8; 10];
    let n = header(OpCode::Control(c), payload.len(), &mut head);
    let mut frame = head[..n].to_vec();
    frame.extend_from_slice(payload);
    frame
}

/// A close frame with `code` and `reason`.
pub(crate) fn close(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(&reason.as_bytes()[..reason.len().min(MAX_CONTROL as usize - 2)]);
    control(Control::Close, &payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tungstenite::protocol::frame::Frame;

    /// A masked client frame, as tungstenite's client side writes it.
    fn client(opcode: OpCode, payload: &[u8], is_final: bool) -> Vec<u8> {
        let header = FrameHeader {
            is_final,
            opcode,
            mask: Some([1, 2, 3, 4]),
            ..FrameHeader::default()
        };
        let mut out = Vec::new();
        Frame::from_payload(header, payload.to_vec().into())
            .format(&mut out)
            .unwrap();
        out
    }

    fn feed_bytewise(bytes: &[u8]) -> Vec<Action> {
        let mut inbox = Inbox::default();
        let mut out = Vec::new();
        for b in bytes {
            inbox.feed(std::slice::from_ref(b), &mut out);
            // The stream stops at a close or a failure.
            if matches!(out.last(), Some(Action::Close(_) | Action::Fail(..))) {
                break;
            }
        }
        out
    }

    #[test]
    fn pings_are_answered_and_data_read_past_in_any_split() {
        let mut bytes = client(TEXT, b"hello", true);
        bytes.extend(client(OpCode::Control(Control::Ping), b"p1", true));
        bytes.extend(client(OpCode::Data(Data::Binary), &[7; 300], false));
        bytes.extend(client(OpCode::Data(Data::Continue), &[7; 10], true));
        bytes.extend(client(
            OpCode::Control(Control::Close),
            &1000u16.to_be_bytes(),
            true,
        ));
        let expected = vec![
            Action::Ignored,
            Action::Pong(b"p1".to_vec()),
            Action::Ignored,
            Action::Close(1000),
        ];
        let mut inbox = Inbox::default();
        let mut out = Vec::new();
        inbox.feed(&bytes, &mut out);
        assert_eq!(out, expected);
        assert_eq!(feed_bytewise(&bytes), expected);
    }

    #[test]
    fn rule_breakers_are_refused() {
        let mut unmasked = Vec::new();
        Frame::message(b"x".to_vec(), TEXT, true)
            .format(&mut unmasked)
            .unwrap();
        assert_eq!(
            feed_bytewise(&unmasked),
            vec![Action::Fail(PROTOCOL_ERROR, "client frames must be masked")]
        );
        let big = client(TEXT, &[0; MAX_CLIENT_FRAME as usize + 1], true);
        assert_eq!(
            feed_bytewise(&big[..20]),
            vec![Action::Fail(TOO_BIG, "frame too big")]
        );
        let stray = client(OpCode::Data(Data::Continue), b"x", true);
        assert_eq!(
            feed_bytewise(&stray),
            vec![Action::Fail(PROTOCOL_ERROR, "continuation out of place")]
        );
        let long_ping = client(OpCode::Control(Control::Ping), &[0; 126], true);
        assert_eq!(
            feed_bytewise(&long_ping),
            vec![Action::Fail(PROTOCOL_ERROR, "bad control frame")]
        );
    }

    #[test]
    fn close_codes_and_reasons_follow_rfc_6455() {
        let close = |payload: &[u8]| feed_bytewise(&client(OpCode::Control(Control::Close), payload, true));
        assert_eq!(close(&[]), vec![Action::Close(1005)]);
        for ok in [1000u16, 1001, 1003, 1007, 1011, 1014, 3000, 4999] {
            assert_eq!(close(&ok.to_be_bytes()), vec![Action::Close(ok)], "{ok}");
        }
        for bad in [0u16, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535] {
            assert_eq!(
                close(&bad.to_be_bytes()),
                vec![Action::Fail(PROTOCOL_ERROR, "invalid close code")],
                "{bad}"
            );
        }
        let mut bad_reason = 1000u16.to_be_bytes().to_vec();
        bad_reason.extend_from_slice(b"\xff\xfe");
        assert_eq!(
            close(&bad_reason),
            vec![Action::Fail(INVALID_DATA, "close reason is not UTF-8")]
        );
        let mut good_reason = 1000u16.to_be_bytes().to_vec();
        good_reason.extend_from_slice("au revoir, café".as_bytes());
        assert_eq!(close(&good_reason), vec![Action::Close(1000)]);
    }

    #[test]
    fn server_frames_parse_back() {
        let mut head = [0u8; 10];
        for len in [0usize, 125, 126, 65535, 65536] {
            let n = header(TEXT, len, &mut head);
            let (h, l) = FrameHeader::parse(&mut Cursor::new(&head[..n])).unwrap().unwrap();
            assert_eq!((h.opcode, l, h.mask), (TEXT, len as u64, None));
        }
        let c = close(GOING_AWAY, "bye");
        assert_eq!(&c[2..], b"\x03\xe9bye");
    }
}
