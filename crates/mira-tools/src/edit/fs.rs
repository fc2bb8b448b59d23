//! Boundary-safe file-system steps shared by the Edit tools.
//!
//! Every path is walked from the workspace root one component at a time through cap-std
//! (`openat2` with `RESOLVE_BENEATH` where the kernel has it), and no component is followed
//! when it is a symlink: directories are opened `O_DIRECTORY|O_NOFOLLOW`, the target
//! `O_NOFOLLOW|O_NONBLOCK` and then checked on the open handle (a regular file, one link, the
//! same inode the `lstat` saw). So a symlink anywhere on the path — there at freeze time or
//! swapped in before execution — and a hard-linked target are `outside_workspace`; FIFOs,
//! sockets and devices are `unsupported_file_type`. The last step of every change is a
//! single-name operation relative to an open parent directory (`renameat`, `renameat2`
//! with `RENAME_NOREPLACE`, `unlinkat`), which never follows a symlink either.

use std::io::{self, Write};
use std::os::unix::fs::{FileExt as _, MetadataExt as _, PermissionsExt as _};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use parking_lot::{Mutex, MutexGuard};
use serde_json::json;
use sha2::{Digest, Sha256};

use mira_core::error_code::ErrorCode;
use mira_core::evidence::sha256_hex;
use mira_core::tool::ToolError;
use mira_core::workspace::{self, Workspace};

/// Largest file an Edit tool reads into memory (to hash it, diff it or replace a block in
/// it), in bytes.
pub const MAX_EDIT_BYTES: u64 = 64 * 1024 * 1024;

/// Most entries a directory walk (delete or move preview, evidence manifest) visits before it
/// stops counting and says so.
pub const MAX_WALK_ENTRIES: u64 = 100_000;

/// Permission bits kept when a file is rewritten: rwx for all and the sticky bit. Set-user-ID
/// and set-group-ID are dropped, since the new bytes come from the model and the new file
/// is owned by the server's user.
pub const KEPT_MODE_BITS: u32 = 0o1777;

/// What [`locate`] does about missing parent directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parents {
    /// A missing parent is `not_found`.
    MustExist,
    /// Missing parents are reported (freeze time of a `create_dirs` write).
    Probe,
    /// Missing parents are created.
    Create,
}

/// The open parent directory of a target and the target's name in it.
pub struct Located {
    /// The parent; None only with [`Parents::Probe`] when some parent is missing.
    pub dir: Option<Dir>,
    /// The final path component.
    pub name: String,
    /// Workspace-relative directories that are missing ([`Parents::Probe`]) or were created
    /// ([`Parents::Create`]), outermost first.
    pub missing_dirs: Vec<String>,
}

/// Opens the parent directory of `rel` (normalised, not the root) beneath the workspace
/// root, one component at a time, refusing symlinks and non-directories on the way. A
/// target that is, lies in or holds one of the server's own folders (its data dir) is
/// `outside_workspace` with `details.reserved`.
pub fn locate(ws: &Workspace, rel: &str, parents: Parents) -> Result<Located, ToolError> {
    let mut parts: Vec<&str> = rel.split('/').collect();
    let name = match parts.pop() {
        Some(n) if !n.is_empty() && n != "." => n.to_owned(),
        _ => return Err(root_refused(rel)),
    };
    let mut dir = ws.dir().try_clone().map_err(|e| workspace::io_error(rel, &e))?;
    if workspace::is_reserved(&dir, None) {
        return Err(workspace::reserved_refused(rel));
    }
    let mut walked = String::new();
    let mut missing = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(part);
        match dir.symlink_metadata(part) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(symlink_refused(rel, &walked)),
            Ok(meta) if !meta.is_dir() => return Err(not_a_directory(rel, &walked)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => match parents {
                Parents::MustExist => return Err(parent_missing(rel, &walked)),
                Parents::Probe => {
                    let mut acc = walked.clone();
                    missing.push(acc.clone());
                    for rest in &parts[i + 1..] {
                        acc.push('/');
                        acc.push_str(rest);
                        missing.push(acc.clone());
                    }
                    return Ok(Located { dir: None, name, missing_dirs: missing });
                }
                Parents::Create => match dir.create_dir(part) {
                    Ok(()) => missing.push(walked.clone()),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(walk_error(rel, &walked, &e)),
                },
            },
            Err(e) => return Err(walk_error(rel, &walked, &e)),
        }
        dir = dir.open_dir_nofollow(part).map_err(|e| walk_error(rel, &walked, &e))?;
        if workspace::is_reserved(&dir, None) {
            return Err(workspace::reserved_refused(rel));
        }
    }
    if workspace::is_reserved(&dir, Some(&name)) {
        return Err(workspace::reserved_refused(rel));
    }
    if workspace::holds_reserved(&dir, Some(&name)) {
        return Err(workspace::reserved_held(rel));
    }
    Ok(Located { dir: Some(dir), name, missing_dirs: missing })
}

/// What a target name is, seen without following it.
pub enum Leaf {
    /// Nothing by that name.
    Missing,
    /// A regular file with one link, opened for reading.
    File(Regular),
    /// A directory.
    Dir,
}

/// An open regular file and the identity it had when opened.
pub struct Regular {
    /// The open handle (read-only).
    pub file: std::fs::File,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl Regular {
    /// Reads the whole file from its start (at most [`MAX_EDIT_BYTES`], else
    /// `file_too_large`).
    pub fn read_all(&self, rel: &str) -> Result<Vec<u8>, ToolError> {
        if self.size > MAX_EDIT_BYTES {
            return Err(too_large(rel, self.size));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(self.size).unwrap_or(0));
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = self.file.read_at(&mut chunk, bytes.len() as u64).map_err(|e| workspace::io_error(rel, &e))?;
            if n == 0 {
                return Ok(bytes);
            }
            bytes.extend_from_slice(&chunk[..n]);
            if bytes.len() as u64 > MAX_EDIT_BYTES {
                return Err(too_large(rel, bytes.len() as u64));
            }
        }
    }

    /// Lowercase hex SHA-256 of the whole file, streamed from its start (no size limit).
    pub fn sha256(&self, rel: &str) -> Result<String, ToolError> {
        let mut hasher = Sha256::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut offset = 0u64;
        loop {
            let n = self.file.read_at(&mut chunk, offset).map_err(|e| workspace::io_error(rel, &e))?;
            if n == 0 {
                return Ok(hex::encode(hasher.finalize()));
            }
            hasher.update(&chunk[..n]);
            offset += n as u64;
        }
    }

    /// True when `other` is the same inode with the same size and modification time.
    pub fn same_version(&self, other: &Regular) -> bool {
        (self.dev, self.ino, self.size, self.mtime_ns) == (other.dev, other.ino, other.size, other.mtime_ns)
    }

    /// True when this is still `before` — the same version ([`Regular::same_version`]) and
    /// bytes that still hash to `sha256` (lowercase hex), so an in-place change that kept the
    /// size and set the modification time back is caught too. Reads the whole file when the
    /// version matches. The last check before a change lands.
    pub fn unchanged(&self, before: &Regular, sha256: &str, rel: &str) -> Result<bool, ToolError> {
        Ok(self.same_version(before) && self.sha256(rel)? == sha256)
    }
}

/// Looks at `name` in `dir` without following it (`rel` names it in errors). A regular file
/// is opened `O_NOFOLLOW|O_NONBLOCK` and re-checked on the handle, so a swap between the
/// `lstat` and the open is caught. Symlinks and hard-linked files are `outside_workspace`;
/// FIFOs, sockets and devices `unsupported_file_type`.
pub fn inspect(dir: &Dir, name: &str, rel: &str) -> Result<Leaf, ToolError> {
    let meta = match dir.symlink_metadata(name) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Leaf::Missing),
        Err(e) => return Err(workspace::io_error(rel, &e)),
    };
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Err(symlink_refused(rel, rel));
    }
    if kind.is_dir() {
        return Ok(Leaf::Dir);
    }
    if !kind.is_file() {
        return Err(workspace::unsupported(rel));
    }
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = dir.open_with(name, &options).map_err(|e| leaf_error(rel, &e))?.into_std();
    let m = file.metadata().map_err(|e| workspace::io_error(rel, &e))?;
    if !m.is_file()
        || m.dev() != cap_std::fs::MetadataExt::dev(&meta)
        || m.ino() != cap_std::fs::MetadataExt::ino(&meta)
    {
        return Err(swapped(rel));
    }
    if m.nlink() > 1 {
        return Err(hard_link_refused(rel, m.nlink()));
    }
    Ok(Leaf::File(Regular {
        dev: m.dev(),
        ino: m.ino(),
        size: m.len(),
        mode: m.mode() & 0o7777,
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        file,
    }))
}

/// How [`write_atomic`] puts the new file in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// The target must not exist (`renameat2(RENAME_NOREPLACE)`): a file created meanwhile
    /// is `stale_target`, never overwritten.
    CreateNew,
    /// The target is replaced (`renameat`).
    Overwrite,
}

/// Writes `bytes` to `name` in `dir` atomically: a temporary file in the same directory,
/// written, given `mode` (or the default `0o666 & !umask`), fsynced, then renamed over the
/// target and the directory fsynced. `before_rename` runs just before the rename (the last
/// precondition check). The temporary file's name names `node` (see
/// [`mira_core::workspace::sweep`], which removes it if the process dies before the rename). On any error the temporary file is removed and the target is
/// untouched; the error carries the OS error.
#[allow(clippy::too_many_arguments)] // each is one fact of the write; a struct would only rename them
pub fn write_atomic(
    dir: &Dir,
    name: &str,
    rel: &str,
    bytes: &[u8],
    mode: Option<u32>,
    replace: Replace,
    node: Option<&str>,
    before_rename: impl FnOnce() -> Result<(), ToolError>,
) -> Result<(), ToolError> {
    let tmp = workspace::sweep::temp_name(node);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true).follow(FollowSymlinks::No).mode(0o666);
    let file = dir.open_with(&tmp, &options).map_err(|e| workspace::io_error(rel, &e))?.into_std();
    let written = (|| {
        (&file).write_all(bytes)?;
        if let Some(mode) = mode {
            file.set_permissions(std::fs::Permissions::from_mode(mode & KEPT_MODE_BITS))?;
        }
        file.sync_all()
    })();
    drop(file);
    let done =
        written.map_err(|e| workspace::io_error(rel, &e)).and_then(|()| before_rename()).and_then(|()| match replace {
            Replace::Overwrite => dir.rename(&tmp, dir, name).map_err(|e| workspace::io_error(rel, &e)),
            Replace::CreateNew => rename_noreplace(dir, &tmp, dir, name, rel),
        });
    if let Err(e) = done {
        let _ = dir.remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir, rel)
}

/// Renames `from` in `from_dir` to `to` in `to_dir` unless `to` exists
/// (`renameat2(RENAME_NOREPLACE)`); an existing `to` is `already_exists` (409).
pub fn rename_noreplace(from_dir: &Dir, from: &str, to_dir: &Dir, to: &str, rel: &str) -> Result<(), ToolError> {
    match rustix::fs::renameat_with(from_dir, from, to_dir, to, rustix::fs::RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::EXIST) => Err(ToolError::new(
            ErrorCode::AlreadyExists,
            format!("{rel} appeared while the change was being made; nothing was overwritten"),
        )
        .with_details(json!({"path": rel}))),
        // A file system without RENAME_NOREPLACE: check, then rename (a narrow window).
        Err(rustix::io::Errno::INVAL) => match to_dir.symlink_metadata(to) {
            Ok(_) => Err(ToolError::new(ErrorCode::AlreadyExists, format!("{rel} already exists"))
                .with_details(json!({"path": rel}))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                from_dir.rename(from, to_dir, to).map_err(|e| workspace::io_error(rel, &e))
            }
            Err(e) => Err(workspace::io_error(rel, &e)),
        },
        Err(errno) => Err(workspace::io_error(rel, &io::Error::from(errno))),
    }
}

/// fsyncs a directory so that a rename or unlink in it is durable.
pub fn sync_dir(dir: &Dir, rel: &str) -> Result<(), ToolError> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(libc::O_DIRECTORY);
    let handle = dir.open_with(".", &options).map_err(|e| workspace::io_error(rel, &e))?.into_std();
    handle.sync_all().map_err(|e| workspace::io_error(rel, &e))
}

/// What a directory tree holds, counted without following symlinks.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TreeSummary {
    /// Regular files.
    pub files: u64,
    /// Directories below the top one.
    pub dirs: u64,
    /// Symlinks, FIFOs, sockets, devices (removed or moved as entries, never followed).
    pub others: u64,
    /// Total size of the regular files, bytes.
    pub bytes: u64,
    /// Lowercase hex SHA-256 of the sorted manifest lines `<kind> <path> <size>\n`
    /// (`kind` = `f`, `d` or `o`; `path` relative to the walked directory), a fingerprint of
    /// the tree's shape and sizes, not of file contents.
    pub manifest_sha256: String,
    /// The first entries, sorted, as workspace-relative paths.
    pub sample: Vec<String>,
    /// True when the walk stopped at [`MAX_WALK_ENTRIES`].
    pub truncated: bool,
}

/// Walks the directory `name` in `dir` (`rel` is its workspace path), never following
/// symlinks, up to [`MAX_WALK_ENTRIES`] entries. The manifest names entries relative to the
/// walked directory, so a tree keeps its fingerprint when it is moved. A tree holding one of
/// the server's own folders is `outside_workspace` with `details.reserved`.
pub fn walk_tree(dir: &Dir, name: &str, rel: &str) -> Result<TreeSummary, ToolError> {
    let top = dir.open_dir_nofollow(name).map_err(|e| walk_error(rel, rel, &e))?;
    if workspace::holds_reserved(&top, None) {
        return Err(workspace::reserved_held(rel));
    }
    let mut stack = vec![(top, String::new())];
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut summary = TreeSummary::default();
    let mut seen: u64 = 0;
    'walk: while let Some((current, prefix)) = stack.pop() {
        let at = if prefix.is_empty() { rel.to_owned() } else { format!("{rel}/{prefix}") };
        let entries = current.entries().map_err(|e| workspace::io_error(&at, &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| workspace::io_error(&at, &e))?;
            seen += 1;
            if seen > MAX_WALK_ENTRIES {
                summary.truncated = true;
                break 'walk;
            }
            let child_name = entry.file_name();
            let inner = if prefix.is_empty() {
                child_name.to_string_lossy().into_owned()
            } else {
                format!("{prefix}/{}", child_name.to_string_lossy())
            };
            let kind = entry.file_type().map_err(|e| workspace::io_error(&at, &e))?;
            if kind.is_dir() {
                summary.dirs += 1;
                lines.push((inner.clone(), format!("d {inner} 0\n")));
                let sub = current.open_dir_nofollow(&child_name).map_err(|e| walk_error(&at, &inner, &e))?;
                stack.push((sub, inner));
            } else if kind.is_file() {
                let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                summary.files += 1;
                summary.bytes += size;
                lines.push((inner.clone(), format!("f {inner} {size}\n")));
            } else {
                summary.others += 1;
                lines.push((inner.clone(), format!("o {inner} 0\n")));
            }
        }
    }
    lines.sort();
    summary.sample = lines.iter().take(50).map(|(p, _)| format!("{rel}/{p}")).collect();
    let manifest: String = lines.into_iter().map(|(_, l)| l).collect();
    summary.manifest_sha256 = sha256_hex(manifest.as_bytes());
    Ok(summary)
}

/// Serialises Edit tools that touch the same absolute paths within this process, so that a
/// precondition check and the write it guards are not interleaved with another edit of
/// the same target. 64 stripes, locked in ascending order (no deadlock).
pub fn lock_paths(paths: &[&str]) -> Vec<MutexGuard<'static, ()>> {
    static STRIPES: [Mutex<()>; 64] = [const { Mutex::new(()) }; 64];
    let mut indices: Vec<usize> = paths
        .iter()
        .map(|p| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            p.hash(&mut h);
            usize::try_from(h.finish() % 64).unwrap_or(0)
        })
        .collect();
    indices.sort_unstable();
    indices.dedup();
    indices.into_iter().filter_map(|i| STRIPES.get(i)).map(Mutex::lock).collect()
}

/// `workspace_root`: the root itself cannot be the target of an edit.
pub fn root_refused(rel: &str) -> ToolError {
    ToolError::new(
        ErrorCode::WorkspaceRoot,
        format!("{rel:?} is the workspace root; an Edit tool never writes, deletes or moves the root itself"),
    )
    .with_details(json!({"path": rel}))
}

/// A symlink on the path: Edit tools never follow one (it could lead outside the workspace,
/// or be swapped to do so between check and use).
pub fn symlink_refused(rel: &str, at: &str) -> ToolError {
    ToolError::new(
        ErrorCode::OutsideWorkspace,
        format!("{rel}: {at} is a symlink; Edit tools do not follow symlinks, which can lead outside the workspace"),
    )
    .with_details(json!({"path": rel, "symlink": at}))
}

/// A target with more than one hard link: writing through it would change a file that may
/// also live outside the workspace.
pub fn hard_link_refused(rel: &str, nlink: u64) -> ToolError {
    ToolError::new(
        ErrorCode::OutsideWorkspace,
        format!("{rel} has {nlink} hard links; Edit tools refuse hard-linked targets, which may be shared with files outside the workspace"),
    )
    .with_details(json!({"path": rel, "hard_links": nlink}))
}

fn swapped(rel: &str) -> ToolError {
    ToolError::new(
        ErrorCode::OutsideWorkspace,
        format!("{rel} was replaced while it was being opened; nothing was changed"),
    )
    .with_details(json!({"path": rel, "swapped": true}))
}

fn not_a_directory(rel: &str, at: &str) -> ToolError {
    ToolError::new(ErrorCode::NotADirectory, format!("{rel}: {at} is not a directory"))
        .with_details(json!({"path": rel, "at": at}))
}

fn parent_missing(rel: &str, at: &str) -> ToolError {
    ToolError::new(ErrorCode::NotFound, format!("{rel}: directory {at} does not exist"))
        .with_details(json!({"path": rel, "missing": at}))
}

fn too_large(rel: &str, size: u64) -> ToolError {
    ToolError::new(
        ErrorCode::FileTooLarge,
        format!("{rel} is {size} bytes; Edit tools handle files up to {MAX_EDIT_BYTES} bytes"),
    )
    .with_details(json!({"path": rel, "size": size, "max": MAX_EDIT_BYTES}))
}

/// An error while opening directory `at` with `O_NOFOLLOW`: ELOOP means a symlink was
/// swapped in after the `lstat`.
fn walk_error(rel: &str, at: &str, e: &io::Error) -> ToolError {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return symlink_refused(rel, at);
    }
    if e.raw_os_error() == Some(libc::ENOTDIR) {
        return not_a_directory(rel, at);
    }
    workspace::io_error(rel, e)
}

fn leaf_error(rel: &str, e: &io::Error) -> ToolError {
    if e.raw_os_error() == Some(libc::ELOOP) { symlink_refused(rel, rel) } else { workspace::io_error(rel, e) }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom};

    use super::*;

    fn file_of(dir: &Dir, name: &str) -> Regular {
        match inspect(dir, name, name) {
            Ok(Leaf::File(f)) => f,
            _ => panic!("{name} is not a regular file"),
        }
    }

    /// The last check before an edit lands: a change in place that kept the size and set the
    /// modification time back passes the version check, not the content check.
    #[test]
    fn a_change_in_place_with_the_old_time_is_not_unchanged() {
        let tmp = std::env::temp_dir().join(format!("mira-fs-unchanged-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let path = tmp.join("f.txt");
        std::fs::write(&path, "approved\n").unwrap();
        let dir = Dir::open_ambient_dir(&tmp, cap_std::ambient_authority()).unwrap();
        let before = file_of(&dir, "f.txt");
        let sha = before.sha256("f.txt").unwrap();
        assert!(file_of(&dir, "f.txt").unchanged(&before, &sha, "f.txt").unwrap());

        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.write_all(b"swapped!\n").unwrap();
        f.set_times(std::fs::FileTimes::new().set_modified(mtime)).unwrap();
        drop(f);

        let now = file_of(&dir, "f.txt");
        assert!(now.same_version(&before), "same inode, size and time: the version check is blind to it");
        assert!(!now.unchanged(&before, &sha, "f.txt").unwrap(), "the content check is not");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
