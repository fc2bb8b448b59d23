//! The workspace boundary: every tool path is relative to a workspace root and is opened
//! beneath it with capability-based resolution (cap-std, which uses `openat2` with
//! `RESOLVE_BENEATH` where the kernel has it). `..`, absolute paths and symlinks that lead
//! out are refused at open time, not by string checks alone; the string checks here only
//! give early, clearer errors.

use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde_json::json;

use crate::registry::{ErrorClass, ToolError};

/// An open workspace root on this host.
#[derive(Clone)]
pub struct Workspace {
    root: PathBuf,
    dir: Arc<Dir>,
}

impl Workspace {
    /// Opens the root folder `root` (must exist and be a directory).
    pub fn open(root: &Path) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(root, ambient_authority())?;
        Ok(Self { root: root.to_path_buf(), dir: Arc::new(dir) })
    }

    /// The absolute root path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root as a capability: every open through it stays beneath the root.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Opens an existing regular file beneath the root for reading. Refuses directories
    /// (`is_a_directory`), FIFOs, sockets and devices (`unsupported_file_type`) and escapes
    /// (`outside_workspace`). Opened non-blocking so a FIFO swapped in cannot hang the
    /// open, and checked on the open handle, so a swap between check and use is caught.
    pub fn open_regular(&self, rel: &str) -> Result<(std::fs::File, std::fs::Metadata), ToolError> {
        use cap_std::fs::OpenOptionsExt;
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = self.dir.open_with(rel, &options).map_err(|e| io_error(rel, &e))?.into_std();
        let meta = file.metadata().map_err(|e| io_error(rel, &e))?;
        if meta.is_dir() {
            return Err(ToolError::new(ErrorClass::BadInput, "is_a_directory", format!("{rel} is a directory"))
                .with_details(json!({"path": rel})));
        }
        if !meta.is_file() {
            return Err(unsupported(rel));
        }
        Ok((file, meta))
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

/// Normalises a workspace-relative path: `""`/`"."` → `"."`, strips `./` and duplicate
/// separators. Refuses absolute paths, `..` components and NUL bytes with
/// `outside_workspace` / `invalid_path`.
pub fn normalize(rel: &str) -> Result<String, ToolError> {
    if rel.contains('\0') {
        return Err(ToolError::new(ErrorClass::BadInput, "invalid_path", "path contains a NUL byte"));
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

/// The `outside_workspace` error for `rel`.
pub fn outside(rel: &str) -> ToolError {
    ToolError::new(ErrorClass::BadInput, "outside_workspace", format!("path {rel:?} leads outside the workspace"))
        .with_details(json!({"path": rel}))
}

/// The `unsupported_file_type` error (FIFO, socket, device) for `rel`.
pub fn unsupported(rel: &str) -> ToolError {
    ToolError::new(
        ErrorClass::BadInput,
        "unsupported_file_type",
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
    let (class, code) = match e.kind() {
        io::ErrorKind::NotFound => (ErrorClass::NotFound, "not_found"),
        io::ErrorKind::PermissionDenied => (ErrorClass::Failed, "permission_denied"),
        io::ErrorKind::NotADirectory => (ErrorClass::BadInput, "not_a_directory"),
        io::ErrorKind::IsADirectory => (ErrorClass::BadInput, "is_a_directory"),
        io::ErrorKind::AlreadyExists => (ErrorClass::Conflict, "already_exists"),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge => {
            (ErrorClass::Failed, "no_space")
        }
        _ if e.raw_os_error() == Some(40) => (ErrorClass::BadInput, "symlink_loop"),
        _ => (ErrorClass::Failed, "io_error"),
    };
    ToolError::new(class, code, format!("{rel}: {e}")).with_details(json!({"path": rel, "os_error": e.raw_os_error()}))
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
            assert_eq!(normalize(bad).map_err(|e| e.code).err().as_deref(), Some("outside_workspace"), "{bad}");
        }
        assert_eq!(normalize("a\0b").map_err(|e| e.code).err().as_deref(), Some("invalid_path"));
    }
}
