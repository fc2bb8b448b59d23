//! Output of a PTY: the bounded in-memory ring every viewer reads from, the UTF-8 decoding
//! of a byte stream that never splits a character, and the head-and-tail capture of one
//! action's window (an error at the end of a long build survives truncation).

use std::collections::VecDeque;

use sha2::{Digest, Sha256};

/// The newest output of a session, addressed by byte offsets from the session's start.
/// Holds at most `cap` bytes; older bytes leave from the front.
#[derive(Debug)]
pub struct Ring {
    buf: VecDeque<u8>,
    start: u64,
    cap: usize,
}

impl Ring {
    /// An empty ring of `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), start: 0, cap: cap.max(1) }
    }

    /// Offset one past the newest byte (= bytes produced so far).
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Offset of the oldest byte still held.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Appends output, dropping the oldest bytes beyond the cap.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
    }

    /// Up to `max` bytes from `from`: `Ok(bytes)` (empty when nothing new), or `Err(start)`
    /// when `from` is older than what the ring holds.
    pub fn read(&self, from: u64, max: usize) -> Result<Vec<u8>, u64> {
        if from < self.start {
            return Err(self.start);
        }
        let skip = usize::try_from(from - self.start).unwrap_or(usize::MAX).min(self.buf.len());
        let take = (self.buf.len() - skip).min(max);
        let (a, b) = self.buf.as_slices();
        let mut out = Vec::with_capacity(take);
        if skip < a.len() {
            out.extend_from_slice(&a[skip..a.len().min(skip + take)]);
        }
        let rest = take - out.len();
        let b_from = skip.saturating_sub(a.len());
        out.extend_from_slice(&b[b_from..b_from + rest]);
        Ok(out)
    }
}

/// Decodes `bytes` for a stream: the text (each invalid sequence becomes U+FFFD, never
/// dropped) and how many trailing bytes were held back because they may begin a character
/// whose remaining bytes have not arrived. With `last`, nothing is held (an incomplete tail
/// becomes U+FFFD).
pub fn decode_utf8(bytes: &[u8], last: bool) -> (String, usize) {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return (out, 0);
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &rest[valid + n..];
                    }
                    None if last => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        return (out, 0);
                    }
                    None => return (out, rest.len() - valid),
                }
            }
        }
    }
}

/// Terminal bytes as plain text: ANSI escape sequences removed (by a VT parser,
/// `strip-ansi-escapes`), carriage returns before newlines dropped, invalid UTF-8 replaced.
pub fn plain_text(bytes: &[u8]) -> String {
    let stripped = strip_ansi_escapes::strip(bytes);
    String::from_utf8_lossy(&stripped).replace("\r\n", "\n")
}

/// `text` cut to at most `max` bytes keeping its head and its tail, with a marker naming what
/// was cut in the middle (character boundaries respected).
pub fn head_tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let marker_room = 48;
    let budget = max.saturating_sub(marker_room);
    let mut head = budget / 4;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (budget - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}\n[… {} bytes cut …]\n{}", &text[..head], tail - head, &text[tail..])
}

/// Head bytes kept by a [`Capture`].
pub const CAPTURE_HEAD: usize = 8 * 1024;
/// Tail bytes kept by a [`Capture`].
pub const CAPTURE_TAIL: usize = 24 * 1024;

/// The output of one action's window `[from, to)`: every byte is hashed, the first
/// [`CAPTURE_HEAD`] and the last [`CAPTURE_TAIL`] bytes are kept.
pub struct Capture {
    from: u64,
    next: u64,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    hasher: Sha256,
    seen: u64,
    missed: u64,
}

/// What a [`Capture`] saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Captured {
    /// First offset of the window.
    pub from: u64,
    /// One past the last offset.
    pub to: u64,
    /// Bytes seen (= `to - from - bytes_missed`).
    pub bytes: u64,
    /// Bytes that left the ring before this capture read them (an output flood).
    pub bytes_missed: u64,
    /// SHA-256 (hex) of the bytes seen, in order.
    pub sha256: String,
    /// ANSI-stripped text: all of it, or head + marker + tail.
    pub text: String,
    /// Whether the middle was cut from `text`.
    pub truncated: bool,
}

impl Capture {
    /// A capture starting at offset `from`.
    pub fn new(from: u64) -> Self {
        Self { from, next: from, head: Vec::new(), tail: VecDeque::new(), hasher: Sha256::new(), seen: 0, missed: 0 }
    }

    /// Offset of the next byte this capture wants.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Reads what is new in `ring`.
    pub fn pull(&mut self, ring: &Ring) {
        loop {
            match ring.read(self.next, 256 * 1024) {
                Ok(bytes) if bytes.is_empty() => return,
                Ok(bytes) => self.feed(&bytes),
                Err(start) => {
                    self.missed += start - self.next;
                    self.next = start;
                }
            }
        }
    }

    fn feed(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.seen += data.len() as u64;
        self.next += data.len() as u64;
        let room = CAPTURE_HEAD.saturating_sub(self.head.len());
        let (h, t) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(h);
        self.tail.extend(t);
        let over = self.tail.len().saturating_sub(CAPTURE_TAIL);
        self.tail.drain(..over);
    }

    /// The summary of the window so far.
    pub fn finish(&self) -> Captured {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let truncated = kept < self.seen || self.missed > 0;
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let text = if kept == self.seen && self.missed == 0 {
            plain_text(&[self.head.as_slice(), tail.as_slice()].concat())
        } else {
            let cut = self.seen - kept + self.missed;
            format!("{}\n[… {cut} bytes cut …]\n{}", plain_text(&self.head), plain_text(&tail))
        };
        Captured {
            from: self.from,
            to: self.next,
            bytes: self.seen,
            bytes_missed: self.missed,
            sha256: hex::encode(self.hasher.clone().finalize()),
            text,
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_bytes() {
        let mut r = Ring::new(4);
        r.push(b"abcdef");
        assert_eq!((r.start(), r.end()), (2, 6));
        assert_eq!(r.read(3, 10), Ok(b"def".to_vec()));
        assert_eq!(r.read(1, 10), Err(2));
        assert_eq!(r.read(6, 10), Ok(vec![]));
    }

    #[test]
    fn split_characters_are_held_not_broken() {
        let smile = "😀".as_bytes();
        let (t, held) = decode_utf8(&[b"a".as_slice(), &smile[..2]].concat(), false);
        assert_eq!((t.as_str(), held), ("a", 2));
        let (t, held) = decode_utf8(smile, false);
        assert_eq!((t.as_str(), held), ("😀", 0));
        let (t, held) = decode_utf8(b"x\xffy", false);
        assert_eq!((t.as_str(), held), ("x\u{FFFD}y", 0));
        let (t, held) = decode_utf8(&smile[..3], true);
        assert_eq!((t.as_str(), held), ("\u{FFFD}", 0));
    }

    #[test]
    fn capture_keeps_head_and_tail_of_long_output() {
        let mut ring = Ring::new(1 << 20);
        let mut c = Capture::new(0);
        ring.push(b"START\n");
        ring.push(&vec![b'x'; 100_000]);
        ring.push(b"\n\x1b[31merror: the end\x1b[0m\n");
        c.pull(&ring);
        let got = c.finish();
        assert!(got.truncated);
        assert!(got.text.starts_with("START"));
        assert!(got.text.ends_with("error: the end\n"), "{}", &got.text[got.text.len() - 40..]);
        assert!(got.text.contains("bytes cut"));
        assert_eq!(got.bytes, ring.end());
    }

    #[test]
    fn head_tail_marks_the_cut() {
        let s = format!("{}{}", "a".repeat(5000), "END");
        let out = head_tail(&s, 1000);
        assert!(out.len() <= 1000 && out.ends_with("END") && out.contains("bytes cut"));
    }
}
