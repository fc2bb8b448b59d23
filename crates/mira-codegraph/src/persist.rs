//! The per-workspace index file: `<data-dir>/codegraph/<first 32 hex of SHA-256(root)>.idx`.
//!
//! Why a file and not the store: the graph is a host-local cache derived from files on this
//! host, rebuilt from them at will, large (millions of references for a big tree), read whole
//! at start and rewritten whole; rows in SQLite/Postgres would add a round trip per file and
//! grow the system of record with data that is not a fact of record. The file holds every
//! indexed file keyed by path with its content SHA-256, so a restart re-reads and re-hashes
//! files but re-parses only those whose hash changed.
//!
//! Format: the 8 bytes `MIRACG01`, then a postcard (serde) encoding of [`Snapshot`]. Written to
//! a temporary file and renamed over the old one, so a crash leaves the old or the new file,
//! never half of one. A file that fails to decode is ignored (and replaced on the next save).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::graph::{FileEntry, Graph};

const MAGIC: &[u8; 8] = b"MIRACG01";

/// Where the index file of `root` lives under `data_dir`.
pub fn snapshot_path(data_dir: &Path, root: &Path) -> PathBuf {
    let digest = mira_core::evidence::sha256_hex(root.to_string_lossy().as_bytes());
    data_dir.join("codegraph").join(format!("{}.idx", &digest[..32]))
}

#[derive(Serialize)]
struct SnapshotRef<'a> {
    root: &'a str,
    names: Names<'a>,
    files: Vec<&'a FileEntry>,
}

struct Names<'a>(&'a [Arc<str>]);

impl Serialize for Names<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|n| &**n))
    }
}

/// The decoded file.
#[derive(Deserialize)]
pub struct Snapshot {
    /// Root the snapshot was made for.
    pub root: String,
    /// The name table.
    pub names: Vec<String>,
    /// Indexed files.
    pub files: Vec<FileEntry>,
}

/// Writes `graph` for `root` to `path` atomically. Returns the bytes written.
pub fn save(path: &Path, root: &Path, graph: &Graph) -> std::io::Result<u64> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let root = root.to_string_lossy();
    let snap =
        SnapshotRef { root: &root, names: Names(graph.names_slice()), files: graph.files().map(|(_, f)| f).collect() };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let file = std::fs::File::create(&tmp)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(MAGIC)?;
    let out = postcard::to_io(&snap, out).map_err(std::io::Error::other)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let len = file.metadata()?.len();
    drop(file);
    std::fs::rename(&tmp, path)?;
    Ok(len)
}

/// Reads the snapshot at `path` made for `root`; None if absent, unreadable, of another
/// format version or made for another root.
pub fn load(path: &Path, root: &Path) -> Option<Graph> {
    let bytes = std::fs::read(path).ok()?;
    let body = bytes.strip_prefix(MAGIC.as_slice())?;
    let snap: Snapshot = match postcard::from_bytes(body) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable code graph index file");
            return None;
        }
    };
    if snap.root != root.to_string_lossy() {
        return None;
    }
    Some(Graph::from_parts(snap.names, snap.files))
}
