//! The workspace boundary: every tool path is relative to a workspace root and is opened
//! beneath it with capability-based resolution (cap-std, which uses `openat2` with
//! `RESOLVE_BENEATH` where the kernel has it). `..`, absolute paths and symlinks that lead
//! out are refused at open time, not by string checks alone; the string checks here only
//! give early, clearer errors.
//!
//! The root itself is held by identity ([`RootIdentity`]): its device and inode are recorded
//! when the workspace is registered, and every use opens the root path once with
//! `O_DIRECTORY|O_NOFOLLOW` (a symlink at the root itself is never followed) and compares
//! the open handle's identity with the recorded one ([`Workspace::open_pinned`]). A root that
//! was replaced, swapped for a symlink or moved is [`RootChange`]d: its tools are
//! `unavailable` with `workspace_changed` and nothing executes in it until an admin
//! re-registers it. Everything a call then does goes through that one open handle (file
//! opens through cap-std, directory walks through `/proc/self/fd/<fd>`), so a swap during
//! the call cannot redirect it either. A walk by path still enters each subfolder by its
//! name, so each entry it yields is kept only if it is the entry at that name beneath the
//! handle, by device and inode ([`Workspace::entry_beneath`]).

pub mod lookalike;
pub mod sweep;

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::Serialize;
use serde_json::json;

use crate::error_code::ErrorCode;
use crate::tool::ToolError;

/// The device and inode of a workspace root folder, stored as `"<dev>:<ino>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootIdentity {
    /// `st_dev` of the root folder.
    pub dev: u64,
    /// `st_ino` of the root folder.
    pub ino: u64,
}

impl RootIdentity {
    /// The stored form, `"<dev>:<ino>"`.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.dev, self.ino)
    }

    /// Parses the stored form; None when it is not `"<dev>:<ino>"`.
    pub fn parse(text: &str) -> Option<Self> {
        let (dev, ino) = text.split_once(':')?;
        Some(Self { dev: dev.parse().ok()?, ino: ino.parse().ok()? })
    }
}

/// How a registered root differs from what was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RootChange {
    /// Nothing is at the root path any more (the folder was moved or deleted).
    Missing,
    /// The root path is now a symlink (never followed at the root).
    Symlink,
    /// The root path is now something other than a directory.
    NotADirectory,
    /// A different directory (another device or inode) is at the root path.
    Replaced,
    /// No identity was recorded for this workspace (it cannot be checked).
    NotRecorded,
    /// The folder the path led to when opened is not at that path as the kernel names it: a
    /// folder on the way to the root is a symlink (or was swapped for one while it was opened),
    /// so the path leads somewhere else.
    Redirected,
}

impl RootChange {
    /// A sentence about the change.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Missing => "nothing is at the registered root path any more (moved or deleted)",
            Self::Symlink => "the registered root path is now a symlink",
            Self::NotADirectory => "the registered root path is no longer a directory",
            Self::Replaced => "a different directory is now at the registered root path",
            Self::NotRecorded => "no root identity was recorded for this workspace",
            Self::Redirected => {
                "a folder on the way to the registered root path is a symlink, so the path leads elsewhere"
            }
        }
    }
}

/// Why a workspace root cannot be used.
#[derive(Debug, Clone)]
pub enum RootError {
    /// The root is not the folder that was registered (`workspace_changed`).
    Changed {
        /// What changed.
        change: RootChange,
        /// The identity found, when something was there.
        found: Option<RootIdentity>,
    },
    /// The root could not be opened for another reason (`workspace_unavailable`).
    Unavailable(String),
}

impl RootError {
    /// The tool error for the root of workspace `id` at `path`: `workspace_changed` (409) or
    /// `workspace_unavailable` (503).
    pub fn to_tool_error(&self, id: &str, path: &str) -> ToolError {
        match self {
            RootError::Changed { change, found } => ToolError::new(
                ErrorCode::WorkspaceChanged,
                format!(
                    "workspace {id} at {path} changed since it was registered: {}; nothing runs in it until an admin \
                     re-registers it (POST /v1/workspaces/{id}/reregister)",
                    change.describe()
                ),
            )
            .with_details(json!({"workspace_id": id, "path": path, "change": change,
                                 "found": found.map(|f| f.encode())})),
            RootError::Unavailable(message) => ToolError::new(
                ErrorCode::WorkspaceUnavailable,
                format!("workspace {id} at {path} cannot be opened: {message}"),
            )
            .with_details(json!({"workspace_id": id, "path": path})),
        }
    }
}

/// Opens the folder at `path` (absolute and canonical: no symlink on the way, no `.` or `..`)
/// itself, never following a symlink there (`O_DIRECTORY|O_NOFOLLOW`), and returns the
/// handle with its identity. `O_NOFOLLOW` guards only the last component, so the opened
/// folder is then checked to be the one at `path`: the kernel's path of the open handle
/// (`/proc/self/fd/<fd>`) must be `path` itself, else a folder on the way was a symlink — or
/// was swapped for one while the path was resolved — and the handle is some other folder
/// (`Changed` with [`RootChange::Redirected`]). Where `/proc` is not mounted, `path` must
/// canonicalise to itself and name a folder of the handle's identity.
pub fn open_root(path: &Path) -> Result<(File, RootIdentity), RootError> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) => {
            let change = match e.raw_os_error() {
                Some(libc::ENOENT) => RootChange::Missing,
                Some(libc::ELOOP) => RootChange::Symlink,
                Some(libc::ENOTDIR) => {
                    // O_DIRECTORY|O_NOFOLLOW on a symlink to a directory may answer ENOTDIR.
                    match std::fs::symlink_metadata(path) {
                        Ok(m) if m.file_type().is_symlink() => RootChange::Symlink,
                        _ => RootChange::NotADirectory,
                    }
                }
                _ => return Err(RootError::Unavailable(e.to_string())),
            };
            return Err(RootError::Changed { change, found: None });
        }
    };
    let meta = file.metadata().map_err(|e| RootError::Unavailable(e.to_string()))?;
    let identity = RootIdentity { dev: meta.dev(), ino: meta.ino() };
    if !opened_at(&file, identity, path) {
        return Err(RootError::Changed { change: RootChange::Redirected, found: Some(identity) });
    }
    Ok((file, identity))
}

/// Whether the open folder `file` (of identity `identity`) is the one at `path`: the
/// kernel's path of the handle is `path`, or, without `/proc`, `path` canonicalises to itself
/// and names a folder of that identity.
fn opened_at(file: &File, identity: RootIdentity, path: &Path) -> bool {
    match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(real) => real == path,
        Err(_) => {
            std::fs::canonicalize(path).is_ok_and(|c| c == path)
                && std::fs::metadata(path).is_ok_and(|m| m.dev() == identity.dev && m.ino() == identity.ino)
        }
    }
}

/// Whether the Read tools open files with more than one hard link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardLinks {
    /// Refused like the Edit tools refuse them (a hard link may share a file outside the
    /// workspace): the default, for a server more than one user shares.
    Refuse,
    /// Read like any file (`--allow-hard-link-reads`, for single-user deployments).
    Allow,
}

/// An open workspace root on this host.
#[derive(Clone)]
pub struct Workspace {
    root: PathBuf,
    dir: Arc<Dir>,
    hard_links: HardLinks,
    node: Option<Arc<str>>,
}

impl Workspace {
    /// Opens the root folder `root` (must exist and be a directory), following symlinks on
    /// the way, without an identity check. For tools and benchmarks given a folder directly;
    /// runs use [`Workspace::open_pinned`].
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(root, ambient_authority())?;
        Ok(Self { root: root.to_path_buf(), dir: Arc::new(dir), hard_links: HardLinks::Refuse, node: None })
    }

    /// Opens the registered root `root` by identity: no symlink is followed at the root
    /// itself, and the folder opened must be the one registered (`expected`, None when none
    /// was recorded). The handle is the workspace from then on, whatever happens at the path.
    pub fn open_pinned(root: &Path, expected: Option<RootIdentity>) -> Result<Self, RootError> {
        let (file, found) = open_root(root)?;
        match expected {
            None => return Err(RootError::Changed { change: RootChange::NotRecorded, found: Some(found) }),
            Some(want) if want != found => {
                return Err(RootError::Changed { change: RootChange::Replaced, found: Some(found) });
            }
            Some(_) => {}
        }
        Ok(Self {
            root: root.to_path_buf(),
            dir: Arc::new(Dir::from_std_file(file)),
            hard_links: HardLinks::Refuse,
            node: None,
        })
    }

    /// The same workspace with the given hard-link rule for the Read tools.
    #[must_use]
    pub fn with_hard_links(mut self, rule: HardLinks) -> Self {
        self.hard_links = rule;
        self
    }

    /// The same workspace, tagged with the stable id of the server node working in it (named
    /// in the Edit tools' temporary files, so a restarted node knows its own leftovers).
    #[must_use]
    pub fn with_node(mut self, node: &str) -> Self {
        self.node = Some(Arc::from(node));
        self
    }

    /// The node tag given with [`Workspace::with_node`].
    pub fn node(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// The hard-link rule of the Read tools.
    pub fn hard_links(&self) -> HardLinks {
        self.hard_links
    }

    /// The absolute root path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root as a capability: every open through it stays beneath the root.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// A path naming the open root handle itself (`/proc/self/fd/<fd>`), for code that walks
    /// the tree by path (the `ignore` walker): the kernel resolves it to the folder this
    /// workspace holds open, whatever is at [`Workspace::root`] now. Falls back to the root
    /// path where `/proc` is not mounted.
    pub fn walk_root(&self) -> PathBuf {
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", self.dir.as_raw_fd()));
        if by_fd.is_dir() { by_fd } else { self.root.clone() }
    }

    /// Opens an existing regular file beneath the root for reading. Refuses directories
    /// (`is_a_directory`), FIFOs, sockets and devices (`unsupported_file_type`), escapes
    /// (`outside_workspace`) and — unless the deployment allows them ([`HardLinks`]) — files
    /// with more than one hard link (`outside_workspace` with `hard_links` in the details).
    /// Opened non-blocking so a FIFO swapped in cannot hang the open, and checked on the
    /// open handle, so a swap between check and use is caught.
    pub fn open_regular(&self, rel: &str) -> Result<(std::fs::File, std::fs::Metadata), ToolError> {
        use cap_std::fs::OpenOptionsExt;
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = self.dir.open_with(rel, &options).map_err(|e| io_error(rel, &e))?.into_std();
        let meta = file.metadata().map_err(|e| io_error(rel, &e))?;
        if meta.is_dir() {
            return Err(ToolError::new(ErrorCode::IsADirectory, format!("{rel} is a directory"))
                .with_details(json!({"path": rel})));
        }
        if !meta.is_file() {
            return Err(unsupported(rel));
        }
        if meta.nlink() > 1 && self.hard_links == HardLinks::Refuse {
            return Err(hard_link_refused(rel, meta.nlink()));
        }
        if is_reserved(&file, None) {
            return Err(reserved_refused(rel));
        }
        Ok((file, meta))
    }

    /// The identity (device and inode) of the open root folder.
    pub fn identity(&self) -> io::Result<RootIdentity> {
        let meta = self.dir.dir_metadata()?;
        Ok(RootIdentity { dev: cap_std::fs::MetadataExt::dev(&meta), ino: cap_std::fs::MetadataExt::ino(&meta) })
    }

    /// Whether the entry `rel` (workspace-relative, `""`/`"."` for the root) that a walk by
    /// path found, with the metadata `walked` it read there (`lstat`), is really the entry at
    /// `rel` beneath this root: `rel` is looked up through the root's capability (no symlink
    /// followed at its end, none that leads out on the way) and must be the same file — the
    /// same device and inode — as the one the walker saw. Returns that metadata (to take
    /// sizes and kinds from), or None.
    ///
    /// A walker that opens subfolders by path (the `ignore` walker) follows a folder swapped
    /// for a symlink between the listing of its parent and its being entered, and would then
    /// list what lies beyond — another user's folder. Every entry a walk yields passes this
    /// check before it is listed, counted or recorded: a swap in either direction during the
    /// walk drops the entry, so nothing outside is named or measured.
    pub fn entry_beneath(&self, rel: &str, walked: &std::fs::Metadata) -> Option<cap_std::fs::Metadata> {
        use std::os::unix::fs::MetadataExt as _;
        let rel = rel.trim_start_matches("./");
        let meta = if rel.is_empty() || rel == "." {
            self.dir.dir_metadata().ok()?
        } else {
            self.dir.symlink_metadata(rel).ok()?
        };
        let same = cap_std::fs::MetadataExt::dev(&meta) == walked.dev()
            && cap_std::fs::MetadataExt::ino(&meta) == walked.ino();
        same.then_some(meta)
    }

    /// Checks that `rel` (already normalised) resolves beneath the root, following
    /// symlinks the way an open would. A missing target is fine here (the tool reports it).
    pub fn check_beneath(&self, rel: &str) -> Result<(), ToolError> {
        match self.dir.metadata(rel) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(rel, &e)),
        }
    }
}

/// A file with more than one hard link, refused by the Read tools on a shared server: the
/// other link may be a file outside the workspace (another user's, the server's secrets).
pub fn hard_link_refused(rel: &str, nlink: u64) -> ToolError {
    ToolError::new(
        ErrorCode::OutsideWorkspace,
        format!(
            "{rel} has {nlink} hard links; on a shared server the Read tools refuse hard-linked files, which may be \
             the same file as one outside the workspace (a single-user deployment may allow them with \
             --allow-hard-link-reads)"
        ),
    )
    .with_details(json!({"path": rel, "hard_links": nlink}))
}

/// True for the error of [`hard_link_refused`].
pub fn is_hard_link_refusal(e: &ToolError) -> bool {
    e.code == ErrorCode::OutsideWorkspace && e.details.get("hard_links").is_some()
}

/// Normalises a workspace-relative path: `""`/`"."` → `"."`, strips `./` and duplicate
/// separators. Refuses absolute paths, `..` components and NUL bytes with
/// `outside_workspace` / `invalid_path`.
pub fn normalize(rel: &str) -> Result<String, ToolError> {
    if rel.contains('\0') {
        return Err(ToolError::new(ErrorCode::InvalidPath, "path contains a NUL byte"));
    }
    let path = Path::new(rel);
    let mut parts: Vec<&str> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside(rel));
            }
        }
    }
    Ok(if parts.is_empty() { ".".to_owned() } else { parts.join("/") })
}

/// The server's own folders (its data dir: admin token, secret key, database, indexes) that
/// the tools never open, even where one lies inside a workspace (the default `./data` of a
/// server whose workspace is its own folder). Process-wide, because every server of the
/// process must hide its folder from every workspace; canonical paths, compared with the
/// kernel's path of an opened handle (`/proc/self/fd`), so symlinks do not hide them.
static RESERVED: std::sync::RwLock<Vec<PathBuf>> = std::sync::RwLock::new(Vec::new());

/// Adds `dir` (canonicalised; it must exist) to the folders the tools never open.
/// Errors: the folder cannot be canonicalised.
pub fn reserve(dir: &Path) -> io::Result<()> {
    let dir = dir.canonicalize()?;
    let mut reserved = RESERVED.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !reserved.contains(&dir) {
        reserved.push(dir);
    }
    Ok(())
}

/// Whether the opened handle `fd`, or its entry `name` when given, is a reserved folder or
/// lies beneath one ([`reserve`]). A handle whose path cannot be read counts as reserved.
pub fn is_reserved(fd: &impl AsRawFd, name: Option<&str>) -> bool {
    is_reserved_beneath(fd, name.map(Path::new))
}

/// As [`is_reserved`], for the path `beneath` the handle (one name or several components).
pub fn is_reserved_beneath(fd: &impl AsRawFd, beneath: Option<&Path>) -> bool {
    let reserved = RESERVED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    if reserved.is_empty() {
        return false;
    }
    let Ok(mut path) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return true;
    };
    if let Some(beneath) = beneath {
        path.push(beneath);
    }
    reserved.iter().any(|r| path.starts_with(r))
}

/// Whether a reserved folder ([`reserve`]) is the opened handle `fd` (or its entry `name`
/// when given) or lies beneath it: a recursive delete or a move of that folder would take
/// the server's own folder with it. A handle whose path cannot be read counts as holding one.
pub fn holds_reserved(fd: &impl AsRawFd, name: Option<&str>) -> bool {
    let reserved = RESERVED.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    if reserved.is_empty() {
        return false;
    }
    let Ok(mut path) = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) else {
        return true;
    };
    if let Some(name) = name {
        path.push(name);
    }
    reserved.iter().any(|r| r.starts_with(&path))
}

/// The `outside_workspace` error for a folder that holds one of the server's own folders.
pub fn reserved_held(rel: &str) -> ToolError {
    ToolError::new(
        ErrorCode::OutsideWorkspace,
        format!("{rel} holds the server's data dir, which no tool deletes or moves"),
    )
    .with_details(json!({"path": rel, "reserved": true}))
}

/// The `outside_workspace` error for a path that is one of the server's own folders.
pub fn reserved_refused(rel: &str) -> ToolError {
    ToolError::new(ErrorCode::OutsideWorkspace, format!("{rel} is part of the server's data dir, which no tool opens"))
        .with_details(json!({"path": rel, "reserved": true}))
}

/// The `outside_workspace` error for `rel`.
pub fn outside(rel: &str) -> ToolError {
    ToolError::new(ErrorCode::OutsideWorkspace, format!("path {rel:?} leads outside the workspace"))
        .with_details(json!({"path": rel}))
}

/// The `unsupported_file_type` error (FIFO, socket, device) for `rel`.
pub fn unsupported(rel: &str) -> ToolError {
    ToolError::new(
        ErrorCode::UnsupportedFileType,
        format!("{rel} is not a regular file or directory (FIFO, socket or device)"),
    )
    .with_details(json!({"path": rel}))
}

/// Maps an I/O error on `rel` to a tool error with a stable code.
pub fn io_error(rel: &str, e: &io::Error) -> ToolError {
    let escaped = e.raw_os_error() == Some(libc_exdev())
        || (e.kind() == io::ErrorKind::PermissionDenied && e.to_string().contains("outside of the filesystem"));
    if escaped {
        return outside(rel);
    }
    let code = match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
        io::ErrorKind::NotADirectory => ErrorCode::NotADirectory,
        io::ErrorKind::IsADirectory => ErrorCode::IsADirectory,
        io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge => ErrorCode::NoSpace,
        _ if e.raw_os_error() == Some(40) => ErrorCode::SymlinkLoop,
        _ => ErrorCode::IoError,
    };
    ToolError::new(code, format!("{rel}: {e}")).with_details(json!({"path": rel, "os_error": e.raw_os_error()}))
}

const fn libc_exdev() -> i32 {
    18 // EXDEV on Linux: openat2(RESOLVE_BENEATH) refused to leave the root.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_accepts_relative_and_refuses_escapes() {
        assert_eq!(normalize("").ok().as_deref(), Some("."));
        assert_eq!(normalize("./src//main.rs").ok().as_deref(), Some("src/main.rs"));
        assert_eq!(normalize("a/./b/").ok().as_deref(), Some("a/b"));
        for bad in ["../x", "a/../../x", "/etc/passwd", "a/.."] {
            assert_eq!(normalize(bad).map_err(|e| e.code).err(), Some(ErrorCode::OutsideWorkspace), "{bad}");
        }
        assert_eq!(normalize("a\0b").map_err(|e| e.code).err(), Some(ErrorCode::InvalidPath));
    }

    /// A fresh, canonical temporary folder (removed by the caller).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mira-root-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.canonicalize().unwrap()
    }

    fn change_of(r: Result<(File, RootIdentity), RootError>) -> Option<RootChange> {
        match r {
            Err(RootError::Changed { change, .. }) => Some(change),
            _ => None,
        }
    }

    /// `O_NOFOLLOW` guards the last component only: a folder on the way that is a symlink
    /// (as when a user's terminal swaps one in between the canonicalisation that passed the
    /// checks and the open) would make the handle, and the pinned identity, some other
    /// folder. The handle's real path must be the path checked.
    #[test]
    fn a_root_reached_through_a_symlinked_folder_is_refused() {
        let base = scratch("redirect");
        std::fs::create_dir_all(base.join("outside/target")).unwrap();
        std::fs::create_dir_all(base.join("roots")).unwrap();
        std::os::unix::fs::symlink(base.join("outside"), base.join("roots/swapped")).unwrap();

        // The real folder opens, with its identity.
        let (_, real) = open_root(&base.join("outside/target")).unwrap();
        // Reached through a symlinked component: the same folder, but not the path checked.
        let via = base.join("roots/swapped/target");
        assert_eq!(change_of(open_root(&via)), Some(RootChange::Redirected));
        // A pinned root re-opened by path after such a swap is refused, not followed, even
        // though the folder reached is the very one registered.
        match Workspace::open_pinned(&via, Some(real)) {
            Err(RootError::Changed { change: RootChange::Redirected, found }) => assert_eq!(found, Some(real)),
            other => panic!("expected redirected, got {:?}", other.err()),
        }
        // A path that does not name the folder the way the kernel does (`..`) is refused too.
        let dotted = base.join("roots/../outside/target");
        assert_eq!(change_of(open_root(&dotted)), Some(RootChange::Redirected));
        // The last component as a symlink stays `symlink`.
        std::os::unix::fs::symlink(base.join("outside/target"), base.join("roots/last")).unwrap();
        assert_eq!(change_of(open_root(&base.join("roots/last"))), Some(RootChange::Symlink));
        // The canonical path works, pinned too.
        assert!(Workspace::open_pinned(&base.join("outside/target"), Some(real)).is_ok());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// A folder swapped for a symlink to a folder outside after a walker (by path) read an
    /// entry beneath it: the entry is not beneath the workspace, whichever way the swap went.
    #[test]
    fn entry_beneath_refuses_what_a_swapped_folder_led_to() {
        let base = scratch("beneath");
        let (root, other) = (base.join("alice"), base.join("bob"));
        std::fs::create_dir_all(root.join("z")).unwrap();
        std::fs::write(root.join("z/own.txt"), "mine").unwrap();
        std::fs::create_dir_all(other.join("private")).unwrap();
        std::fs::write(other.join("private/secret.txt"), "secret!").unwrap();
        let ws = Workspace::open(&root).unwrap();
        let walk = ws.walk_root();

        // Her own entry, as the walker sees it: accepted, with the capability's metadata.
        let own = std::fs::symlink_metadata(walk.join("z/own.txt")).unwrap();
        assert_eq!(ws.entry_beneath("z/own.txt", &own).map(|m| m.len()), Some(4));
        let top = std::fs::metadata(&walk).unwrap();
        assert!(ws.entry_beneath("", &top).is_some_and(|m| m.is_dir()));

        // z becomes a symlink to the other folder; the walker, by path, reaches its file.
        std::fs::rename(root.join("z"), root.join("z.r")).unwrap();
        std::os::unix::fs::symlink(&other, root.join("z")).unwrap();
        let seen = std::fs::symlink_metadata(walk.join("z/private/secret.txt")).unwrap();
        assert_eq!(seen.len(), 7, "the walk by path did leave the workspace");
        assert!(ws.entry_beneath("z/private/secret.txt", &seen).is_none());
        assert!(ws.entry_beneath("z/private", &std::fs::symlink_metadata(walk.join("z/private")).unwrap()).is_none());
        // The symlink itself is an entry of the workspace (listed as what it is).
        let link = std::fs::symlink_metadata(walk.join("z")).unwrap();
        assert!(ws.entry_beneath("z", &link).is_some_and(|m| m.file_type().is_symlink()));

        // Swapped back before the check: the name leads to her folder, not to that file.
        std::fs::remove_file(root.join("z")).unwrap();
        std::fs::rename(root.join("z.r"), root.join("z")).unwrap();
        assert!(ws.entry_beneath("z/private/secret.txt", &seen).is_none());
        // A file of hers at the same name is another inode: still refused for what was seen.
        std::fs::create_dir_all(root.join("z/private")).unwrap();
        std::fs::write(root.join("z/private/secret.txt"), "hers").unwrap();
        assert!(ws.entry_beneath("z/private/secret.txt", &seen).is_none());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
