//! Reading a session's output at any byte offset — from the live ring (the newest bytes,
//! some perhaps not yet stored) or from the store — for the SSE stream, for an action's
//! capture, and for explicit reads of a range (`output` action, `GET …/output`): the
//! rendered text of `[from, to)` a page at a time, or the rendered lines matching a regex
//! with their offsets.
//!
//! Since output leaves the ring only once stored (see [`super::host`]), the ring and the
//! store together hold every byte from the session's `retained_from` to its end; what a read
//! finds missing is exactly the prefix the retention cap dropped, reported as a gap.

use regex::Regex;
use serde::Serialize;

use super::host::Session;
use super::output::{Capture, Captured, LineRenderer};
use crate::store::{Store, StoreError};

/// Bytes read from the store or the ring at once.
pub const READ_BYTES: usize = 256 * 1024;

/// What a read at an offset found.
#[derive(Debug)]
pub enum Piece {
    /// Bytes starting at the offset.
    Bytes(Vec<u8>),
    /// The bytes from the offset up to this one are no longer retained.
    Gap(u64),
    /// Nothing at or after the offset (yet).
    Nothing,
}

/// A session's output, wherever it is: its live ring (when this process runs it) and the store.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    /// The store.
    pub store: &'a Store,
    /// The session id.
    pub id: &'a str,
    /// The live session, when this process holds it.
    pub live: Option<&'a Session>,
}

impl Source<'_> {
    /// Offset one past the last byte produced so far: the ring's end for a live session,
    /// the recorded `bytes_out` otherwise.
    pub async fn end(&self) -> Result<u64, StoreError> {
        match self.live {
            Some(s) => Ok(s.with_ring(|r| r.end())),
            None => Ok(self
                .store
                .terminal_session_for_any(self.id)
                .await?
                .map_or(0, |r| u64::try_from(r.bytes_out).unwrap_or(0))),
        }
    }

    /// Up to `max` bytes from `offset`: from the ring when it still holds them, else from the
    /// store; a gap when neither has them (past the retention cap).
    pub async fn read(&self, offset: u64, max: usize) -> Result<Piece, StoreError> {
        let max = max.max(1);
        let ring_start = match self.live {
            Some(s) => match s.with_ring(|r| r.read(offset, max)) {
                Ok(bytes) if bytes.is_empty() => return Ok(Piece::Nothing),
                Ok(bytes) => return Ok(Piece::Bytes(bytes)),
                Err(start) => Some(start),
            },
            None => None,
        };
        let chunks = i64::try_from(max.div_ceil(super::host::FLUSH_CHUNK) + 1).unwrap_or(2);
        let stored = self.store.terminal_chunks_from(self.id, offset, chunks).await?;
        let mut out = Vec::new();
        let mut at = offset;
        for (start, bytes) in &stored {
            if *start > at {
                break;
            }
            let skip = usize::try_from(at - start).unwrap_or(usize::MAX).min(bytes.len());
            let take = (max - out.len()).min(bytes.len() - skip);
            out.extend_from_slice(&bytes[skip..skip + take]);
            at += take as u64;
            if out.len() >= max {
                break;
            }
        }
        if !out.is_empty() {
            return Ok(Piece::Bytes(out));
        }
        // Nothing stored at this offset: the next stored chunk or the ring is further on.
        let next_stored = stored.first().map(|c| c.0);
        Ok(match (next_stored, ring_start) {
            (Some(a), Some(b)) => Piece::Gap(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Piece::Gap(a),
            (None, None) => {
                let total = self.end().await?;
                if total > offset { Piece::Gap(total) } else { Piece::Nothing }
            }
        })
    }

    /// Feeds `capture` everything from its next offset up to `to` (or to the end so far
    /// when `to` is None); bytes no longer retained are recorded as missed.
    pub async fn pull(&self, capture: &mut Capture, to: Option<u64>) -> Result<(), StoreError> {
        loop {
            let want = match to {
                Some(to) if capture.next() >= to => return Ok(()),
                Some(to) => usize::try_from(to - capture.next()).unwrap_or(READ_BYTES).min(READ_BYTES),
                None => READ_BYTES,
            };
            match self.read(capture.next(), want).await? {
                Piece::Bytes(b) => capture.feed(&b),
                Piece::Gap(g) => capture.skip_to(to.map_or(g, |t| g.min(t))),
                Piece::Nothing => return Ok(()),
            }
        }
    }

    /// The rendered text of `[from, to)` (to the end so far when `to` is None), at most
    /// `max_bytes` of it: the answer says where it stopped.
    pub async fn page(&self, from: u64, to: Option<u64>, max_bytes: u64, size: (u16, u16)) -> Result<Page, StoreError> {
        let end = self.end().await?;
        let to = to.unwrap_or(end).min(end).max(from);
        let head = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        let mut capture = Capture::with_limits(from, size.0, size.1, head, 0);
        // Bytes no longer retained do not count against `max_bytes`.
        while capture.next() < to && capture.seen() < max_bytes {
            let want = (to - capture.next()).min(max_bytes - capture.seen());
            match self.read(capture.next(), usize::try_from(want).unwrap_or(READ_BYTES).min(READ_BYTES)).await? {
                Piece::Bytes(b) => capture.feed(&b),
                Piece::Gap(g) => capture.skip_to(g.min(to)),
                Piece::Nothing => break,
            }
        }
        let captured = capture.finish();
        let next_from = (captured.to < to).then_some(captured.to);
        Ok(Page { captured, next_from })
    }

    /// The lines of `[from, to)` whose rendered text matches `pattern`, in order, at most
    /// `max_matches`. Each raw line (up to its `\n`) is rendered on a one-row terminal
    /// `cols` wide (see [`LineRenderer`]).
    pub async fn search(
        &self,
        from: u64,
        to: Option<u64>,
        pattern: &Regex,
        max_matches: usize,
        cols: u16,
    ) -> Result<Search, StoreError> {
        let end = self.end().await?;
        let to = to.unwrap_or(end).min(end).max(from);
        let mut found = Search { from, to, matches: Vec::new(), next_from: None, missed_ranges: Vec::new(), bytes: 0 };
        let mut lines = LineRenderer::new(cols);
        let mut at = from;
        let mut line_start = from;
        let check = |found: &mut Search, texts: Vec<String>, start: u64, end: u64| {
            for line in texts {
                if pattern.is_match(&line) {
                    if found.matches.len() >= max_matches {
                        found.next_from = Some(start);
                        return false;
                    }
                    found.matches.push(LineMatch { offset: start, end, line });
                }
            }
            true
        };
        while at < to {
            let want = usize::try_from(to - at).unwrap_or(READ_BYTES).min(READ_BYTES);
            match self.read(at, want).await? {
                Piece::Bytes(bytes) => {
                    found.bytes += bytes.len() as u64;
                    for segment in bytes.split_inclusive(|b| *b == b'\n') {
                        let seg_end = at + segment.len() as u64;
                        let done = lines.feed_line(segment);
                        if segment.last() == Some(&b'\n') {
                            if !check(&mut found, done, line_start, seg_end) {
                                return Ok(found);
                            }
                            line_start = seg_end;
                        }
                        at = seg_end;
                    }
                }
                Piece::Gap(g) => {
                    let g = g.min(to);
                    if let Some(partial) = lines.finish()
                        && !check(&mut found, vec![partial], line_start, at)
                    {
                        return Ok(found);
                    }
                    lines = LineRenderer::new(cols);
                    match found.missed_ranges.last_mut() {
                        Some(last) if last[1] == at => last[1] = g,
                        _ => found.missed_ranges.push([at, g]),
                    }
                    at = g;
                    line_start = g;
                }
                Piece::Nothing => break,
            }
        }
        if let Some(partial) = lines.finish() {
            check(&mut found, vec![partial], line_start, at);
        }
        Ok(found)
    }
}

/// One page of a range read.
pub struct Page {
    /// What was read: range, bytes, missed ranges, digest, rendered text.
    pub captured: Captured,
    /// Where the next page starts, when the range goes on.
    pub next_from: Option<u64>,
}

/// A line that matched, with its place in the session's output.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LineMatch {
    /// Byte offset where the raw line begins.
    pub offset: u64,
    /// Byte offset one past its `\n` (or the end of the range).
    pub end: u64,
    /// The line as a terminal shows it (at most 64 KiB).
    pub line: String,
}

/// The answer of a search.
#[derive(Debug, Clone)]
pub struct Search {
    /// First offset searched.
    pub from: u64,
    /// One past the last offset searched.
    pub to: u64,
    /// Matching lines, in order.
    pub matches: Vec<LineMatch>,
    /// When more lines matched than were returned: the offset of the first line not
    /// returned (search again from there).
    pub next_from: Option<u64>,
    /// Parts of the range no longer retained.
    pub missed_ranges: Vec<[u64; 2]>,
    /// Bytes searched.
    pub bytes: u64,
}
