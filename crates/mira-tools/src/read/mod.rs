//! Read: `read_discover` (directories, paths, file-name candidates), `grep` (content),
//! `read_open` (a known file or line range), and the legacy read entries. All confined to
//! the run's workspace and run without approval.

pub mod discover;
pub mod grep;
pub mod legacy;
pub mod open;

use mira_core::error_code::ErrorCode;
use mira_core::tool::ToolError;

/// Runs blocking file-system work on the blocking pool, mapping a panic or cancellation of
/// that task to a tool error.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::new(ErrorCode::Internal, format!("worker failed: {e}")))?
}
