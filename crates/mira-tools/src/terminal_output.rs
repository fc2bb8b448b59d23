//! Output of a PTY: the bounded in-memory ring every viewer reads from, the UTF-8 decoding
//! of a byte stream that never splits a character, the rendering of terminal bytes into the
//! text a terminal shows (a VT100/xterm emulator, the `vt100` crate), and the capture of one
//! action's window (every byte hashed; head and tail kept, so an error at the end of a long
//! build survives truncation).

use std::collections::VecDeque;

use sha2::{Digest, Sha256};

/// The newest output of a session, addressed by byte offsets from the session's start.
///
/// Holds at most `cap` bytes. Only bytes already in the store (before [`Ring::stored`]) may
/// leave it: a push that would push out bytes not yet stored takes only what fits, and the
/// PTY reader waits for the flusher (back-pressure reaches the program as a blocked write).
/// In *spill* mode (the session's flusher has finished) old bytes leave whether stored or not.
#[derive(Debug)]
pub struct Ring {
    buf: VecDeque<u8>,
    start: u64,
    cap: usize,
    stored: u64,
    spill: bool,
}

/// Smallest ring, in bytes (a smaller configured size is raised to this).
pub const MIN_RING_BYTES: usize = 4096;

impl Ring {
    /// An empty ring of `cap` bytes (at least [`MIN_RING_BYTES`]).
    pub fn new(cap: usize) -> Self {
        Self { buf: VecDeque::new(), start: 0, cap: cap.max(MIN_RING_BYTES), stored: 0, spill: false }
    }

    /// Offset one past the newest byte (= bytes produced so far).
    pub fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Offset of the oldest byte still held.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Bytes before this offset are in the store (or were given up: see [`Ring::mark_stored`]).
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// Bytes held that are not yet in the store.
    pub fn unstored(&self) -> u64 {
        self.end() - self.stored.clamp(self.start, self.end())
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Appends as much of `data` as fits without pushing out bytes that are not stored, and
    /// returns how many bytes it took (all of them in spill mode). Stored bytes beyond the
    /// capacity leave from the front.
    pub fn push(&mut self, data: &[u8]) -> usize {
        let take = if self.spill {
            data.len()
        } else {
            let unstored = usize::try_from(self.unstored()).unwrap_or(usize::MAX);
            data.len().min(self.cap.saturating_sub(unstored))
        };
        self.buf.extend(&data[..take]);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
        take
    }

    /// Records that the bytes before `offset` are stored (or need never be: older than the
    /// retention cap), so they may leave the ring.
    pub fn mark_stored(&mut self, offset: u64) {
        self.stored = self.stored.max(offset.min(self.end()));
    }

    /// Switches to spill mode: pushes never wait again.
    pub fn spill(&mut self) {
        self.spill = true;
    }

    /// Whether the ring is in spill mode.
    pub fn spilling(&self) -> bool {
        self.spill
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

/// Rows of the emulator [`render`] uses at most (a taller PTY is rendered this tall: only
/// programs that address rows below it are drawn differently).
pub const RENDER_MAX_ROWS: u16 = 100;

/// Collects the rows that scroll off the top of the main screen (an xterm keeps them in its
/// scrollback; rows scrolled on the alternate screen are not kept, as in an xterm).
/// Rows are kept only while `formatted` is shorter than `cap` bytes.
struct Scrolled {
    formatted: String,
    state: vt100::capture::BasicFormattedCaptureState,
    cap: usize,
}

impl vt100::Callbacks for Scrolled {
    fn on_scroll(&mut self, row: vt100::capture::RowContents<'_>, alternate_screen: bool) {
        if !alternate_screen && self.formatted.len() < self.cap {
            // Writing into a String cannot fail.
            let _ = row.write_formatted_basic(&mut self.formatted, &mut self.state);
        }
    }
}

fn emulator(rows: u16, cols: u16, cap: usize) -> vt100::Parser<Scrolled> {
    let size = |v: u16, max: u16| std::num::NonZeroU16::new(v.clamp(1, max)).unwrap_or(std::num::NonZeroU16::MIN);
    let scrolled = Scrolled { formatted: String::new(), state: Default::default(), cap };
    vt100::Parser::new_with_callbacks(size(rows, RENDER_MAX_ROWS), size(cols, 1000), 0, scrolled)
}

/// `bytes` as a terminal of `rows` × `cols` shows them, starting from a blank screen: the
/// scrollback (every row that scrolled off the top) followed by the screen, as plain text.
/// Carriage returns, erases, cursor moves and overwrites are applied; colours and other
/// attributes are dropped; a row that wrapped joins the next into one line; trailing blanks
/// of a row and blank rows at the end are not text. Ends with `\n` when `bytes` does (the
/// cursor then waits on an empty line).
///
/// The emulator is VT100/xterm as implemented by the `vt100` crate (<https://docs.rs/vt100>).
pub fn render(bytes: &[u8], rows: u16, cols: u16) -> String {
    let mut parser = emulator(rows, cols, usize::MAX);
    parser.process(bytes);
    let (screen, scrolled) = parser.screen_and_callbacks_mut();
    let mut formatted = std::mem::take(&mut scrolled.formatted);
    let _ = screen.write_contents_formatted_basic(
        &mut formatted,
        vt100::capture::BasicFormattedCaptureRange::Full(&mut scrolled.state),
    );
    let mut text: String = vt100::capture::basic_formatted_to_plain(&formatted).collect();
    let keep = text.trim_end_matches('\n').len();
    text.truncate(keep);
    if bytes.last() == Some(&b'\n') && !text.is_empty() {
        text.push('\n');
    }
    text
}

/// Longest line a [`LineRenderer`] keeps, in bytes (the rest of a longer line is dropped).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Renders a byte stream line by line, for searching: each raw line (up to and including its
/// `\n`) is drawn on a blank two-row terminal `cols` wide, so `\r`, erases and colours are
/// applied within the line as a terminal applies them, and a line longer than the terminal
/// (wrapped rows) stays one line. Fed in raw-line pieces, it returns the lines each piece
/// completed.
pub struct LineRenderer {
    parser: vt100::Parser<Scrolled>,
}

impl LineRenderer {
    /// A renderer for a terminal `cols` wide.
    pub fn new(cols: u16) -> Self {
        Self { parser: emulator(2, cols, 2 * MAX_LINE_BYTES) }
    }

    /// Feeds one raw line (ending with `\n`, except perhaps the last piece of a range) and
    /// returns the text of the lines it completed (usually one; none for a piece without
    /// `\n`, whose line [`LineRenderer::finish`] gives).
    pub fn feed_line(&mut self, raw: &[u8]) -> Vec<String> {
        self.parser.process(raw);
        if raw.last() != Some(&b'\n') {
            return Vec::new();
        }
        self.take().split('\n').map(|l| cut_line(l).to_owned()).collect()
    }

    /// The text of an unterminated last line, if there is one.
    pub fn finish(&mut self) -> Option<String> {
        let text = self.take();
        (!text.is_empty()).then(|| cut_line(&text).to_owned())
    }

    /// What was drawn since the last take (rows wrapped off the top, then the screen), as
    /// plain text without trailing blank rows; the screen is then cleared.
    fn take(&mut self) -> String {
        let (screen, scrolled) = self.parser.screen_and_callbacks_mut();
        let mut formatted = std::mem::take(&mut scrolled.formatted);
        let _ = screen.write_contents_formatted_basic(
            &mut formatted,
            vt100::capture::BasicFormattedCaptureRange::Full(&mut scrolled.state),
        );
        scrolled.state = vt100::capture::BasicFormattedCaptureState::default();
        self.parser.process(b"\x1b[H\x1b[2J");
        let plain: String = vt100::capture::basic_formatted_to_plain(&formatted).collect();
        plain.trim_end_matches('\n').to_owned()
    }
}

fn cut_line(line: &str) -> &str {
    if line.len() <= MAX_LINE_BYTES {
        return line;
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
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

/// Raw head bytes an action's [`Capture`] keeps.
pub const CAPTURE_HEAD: usize = 8 * 1024;
/// Raw tail bytes an action's [`Capture`] keeps.
pub const CAPTURE_TAIL: usize = 24 * 1024;
/// Longest rendered text of a capture, in bytes: twice its raw head and tail (cursor moves
/// can draw more text than they take bytes); head and tail of the text are kept beyond it.
pub fn capture_text_max(head: usize, tail: usize) -> usize {
    2 * (head + tail)
}

/// The output of one window `[from, to)` of a session: every byte seen is hashed, the first
/// `head` and the last `tail` raw bytes are kept and rendered at the end; bytes no longer
/// retained when the capture reached them are recorded as missed ranges.
pub struct Capture {
    from: u64,
    next: u64,
    head: Vec<u8>,
    head_max: usize,
    /// Offset one past the last head byte.
    head_end: u64,
    tail: VecDeque<u8>,
    tail_max: usize,
    hasher: Sha256,
    seen: u64,
    missed: Vec<[u64; 2]>,
    rows: u16,
    cols: u16,
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
    /// Bytes of the window that were no longer retained (past the retention cap) when read.
    pub bytes_missed: u64,
    /// Those bytes as `[from, to)` ranges, in order.
    pub missed_ranges: Vec<[u64; 2]>,
    /// SHA-256 (hex) of the bytes seen, in order.
    pub sha256: String,
    /// The rendered text (see [`render`]): all of it, or head + marker + tail, with a marker
    /// for bytes no longer retained.
    pub text: String,
    /// Whether any part of the window is missing from `text`.
    pub truncated: bool,
}

impl Capture {
    /// An action's capture starting at offset `from`, rendered on a `rows` × `cols` terminal.
    pub fn new(from: u64, rows: u16, cols: u16) -> Self {
        Self::with_limits(from, rows, cols, CAPTURE_HEAD, CAPTURE_TAIL)
    }

    /// A capture keeping `head` and `tail` raw bytes.
    pub fn with_limits(from: u64, rows: u16, cols: u16, head: usize, tail: usize) -> Self {
        Self {
            from,
            next: from,
            head: Vec::new(),
            head_max: head,
            head_end: from,
            tail: VecDeque::new(),
            tail_max: tail,
            hasher: Sha256::new(),
            seen: 0,
            missed: Vec::new(),
            rows,
            cols,
        }
    }

    /// Offset of the next byte this capture wants.
    pub fn next(&self) -> u64 {
        self.next
    }

    /// Bytes seen so far.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Takes the bytes at [`Capture::next`].
    pub fn feed(&mut self, data: &[u8]) {
        self.hasher.update(data);
        self.seen += data.len() as u64;
        let room = self.head_max.saturating_sub(self.head.len());
        let (h, t) = data.split_at(room.min(data.len()));
        if !h.is_empty() {
            self.head.extend_from_slice(h);
            self.head_end = self.next + h.len() as u64;
        }
        self.next += data.len() as u64;
        if self.tail_max > 0 {
            let t = &t[t.len().saturating_sub(self.tail_max)..];
            self.tail.extend(t);
            let over = self.tail.len().saturating_sub(self.tail_max);
            self.tail.drain(..over);
        }
    }

    /// Records that the bytes from [`Capture::next`] to `to` are no longer retained.
    pub fn skip_to(&mut self, to: u64) {
        if to <= self.next {
            return;
        }
        match self.missed.last_mut() {
            Some(last) if last[1] == self.next => last[1] = to,
            _ => self.missed.push([self.next, to]),
        }
        self.next = to;
    }

    /// The summary of the window so far.
    pub fn finish(&self) -> Captured {
        let missed: u64 = self.missed.iter().map(|r| r[1] - r[0]).sum();
        let kept = (self.head.len() + self.tail.len()) as u64;
        // Bytes missed before anything was seen are named first; any others count as cut.
        let missed_first = self.missed.first().filter(|r| r[0] == self.from).map_or(0, |r| r[1] - r[0]);
        let mut text = String::new();
        if missed_first > 0 {
            text.push_str(&format!("[… {missed_first} bytes no longer retained …]\n"));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        if kept == self.seen && missed == missed_first {
            text.push_str(&render(&[self.head.as_slice(), tail.as_slice()].concat(), self.rows, self.cols));
        } else {
            // The tail is rendered from the start of a line when it has one early on.
            let skip = tail.iter().take(4096).position(|b| *b == b'\n').map_or(0, |p| p + 1);
            let cut = self.seen - kept + (missed - missed_first) + skip as u64;
            let (cut_from, cut_to) = (self.head_end, self.next - (tail.len() - skip) as u64);
            let head = render(&self.head, self.rows, self.cols);
            text.push_str(&head);
            if !head.is_empty() && !head.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("[… {cut} bytes cut; read them with output from={cut_from} to={cut_to} …]\n"));
            text.push_str(&render(&tail[skip..], self.rows, self.cols));
        }
        let text_max = capture_text_max(self.head_max, self.tail_max);
        let truncated = kept < self.seen || missed > 0 || text.len() > text_max;
        Captured {
            from: self.from,
            to: self.next,
            bytes: self.seen,
            bytes_missed: missed,
            missed_ranges: self.missed.clone(),
            sha256: hex::encode(self.hasher.clone().finalize()),
            text: head_tail(&text, text_max),
            truncated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_stored_bytes() {
        let mut r = Ring::new(MIN_RING_BYTES);
        assert_eq!(r.push(&[b'a'; 4000]), 4000);
        r.mark_stored(4000);
        assert_eq!(r.push(&[b'b'; 1000]), 1000);
        r.mark_stored(u64::MAX);
        assert_eq!(r.stored(), 5000, "never past the end");
        assert_eq!(r.push(b"def"), 3);
        assert_eq!((r.start(), r.end()), (5003 - 4096, 5003));
        assert_eq!(r.read(5000, 10), Ok(b"def".to_vec()));
        assert_eq!(r.read(1, 10), Err(5003 - 4096));
        assert_eq!(r.read(5003, 10), Ok(vec![]));
    }

    #[test]
    fn ring_never_drops_unstored_bytes() {
        let mut r = Ring::new(MIN_RING_BYTES);
        assert_eq!(r.push(&[1; 3000]), 3000);
        assert_eq!(r.push(&[2; 3000]), 1096, "only what fits");
        assert_eq!(r.push(&[3; 10]), 0, "full of unstored bytes: the writer must wait");
        assert_eq!((r.start(), r.unstored()), (0, 4096));
        r.mark_stored(1000);
        assert_eq!(r.push(&[3; 3000]), 1000);
        assert_eq!((r.start(), r.end(), r.unstored()), (1000, 5096, 4096));
        r.spill();
        assert_eq!(r.push(&[4; 10_000]), 10_000, "spill mode takes everything");
        assert_eq!(r.end() - r.start(), 4096);
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
    fn render_applies_what_a_terminal_applies() {
        assert_eq!(render(b"a 10%\r\x1b[Kb 100%\r\n", 32, 120), "b 100%\n");
        assert_eq!(render(b"\x1b[1;31merror\x1b[0m: x\r\nabc\x1b[2Dx", 32, 120), "error: x\naxc");
        assert_eq!(render(&[b'z'; 250], 32, 100), "z".repeat(250), "a wrapped line stays one line");
        // Scrolled-off rows are kept: far more lines than the screen has rows.
        let many: String = (0..500).map(|i| format!("line {i}\r\n")).collect();
        let want: String = (0..500).map(|i| format!("line {i}\n")).collect();
        assert_eq!(render(many.as_bytes(), 24, 80), want);
        // A full-screen program's alternate screen leaves the main screen as it was.
        assert_eq!(render(b"before\r\n\x1b[?1049hvim stuff\x1b[?1049lafter\r\n", 24, 80), "before\nafter\n");
        assert_eq!(render(b"", 24, 80), "");
    }

    #[test]
    fn line_renderer_gives_one_line_per_raw_line() {
        let mut r = LineRenderer::new(20);
        assert_eq!(r.feed_line(b"a 10%\r\x1b[Kb 100%\r\n"), vec!["b 100%"]);
        assert_eq!(r.feed_line(&[[b'q'; 50].as_slice(), b"\r\n"].concat()), vec!["q".repeat(50)]);
        assert_eq!(r.feed_line(b"\x1b[32mgreen\x1b[0m\r\n"), vec!["green"]);
        assert!(r.feed_line(b"tail without newline").is_empty());
        assert_eq!(r.finish().as_deref(), Some("tail without newline"));
    }

    #[test]
    fn capture_keeps_head_and_tail_of_long_output() {
        let mut c = Capture::new(0, 32, 120);
        let mut all = Vec::new();
        all.extend_from_slice(b"START\r\n");
        all.extend(std::iter::repeat_n(b'x', 100_000));
        all.extend_from_slice(b"\r\n\x1b[31merror: the end\x1b[0m\r\n");
        c.feed(&all);
        let got = c.finish();
        assert!(got.truncated);
        assert!(got.text.starts_with("START\n"), "{}", &got.text[..40]);
        assert!(got.text.ends_with("\nerror: the end\n"), "{}", &got.text[got.text.len() - 40..]);
        let cut = format!("bytes cut; read them with output from=8192 to={} …]", all.len() - CAPTURE_TAIL);
        assert!(got.text.contains(&cut), "{}", &got.text[8000..8300]);
        assert_eq!(got.bytes, all.len() as u64);
        assert_eq!(got.sha256, hex::encode(Sha256::digest(&all)));
    }

    #[test]
    fn capture_names_bytes_no_longer_retained() {
        let mut c = Capture::new(10, 32, 120);
        c.skip_to(500);
        c.feed(b"kept\r\n");
        let got = c.finish();
        assert_eq!((got.from, got.to, got.bytes, got.bytes_missed), (10, 506, 6, 490));
        assert_eq!(got.missed_ranges, vec![[10, 500]]);
        assert_eq!(got.text, "[… 490 bytes no longer retained …]\nkept\n");
    }

    #[test]
    fn head_tail_marks_the_cut() {
        let s = format!("{}{}", "a".repeat(5000), "END");
        let out = head_tail(&s, 1000);
        assert!(out.len() <= 1000 && out.ends_with("END") && out.contains("bytes cut"));
    }
}
