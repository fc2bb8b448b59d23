//! The sandbox of stdio MCP servers installed by non-admin users.
//!
//! Such a server is a process on the server host started for a user, so it gets the same
//! sandbox as their terminal sessions, minus a workspace: the system read-only, its own
//! install tree read-only (the folder above the command's `bin/`, before and after
//! resolving links, and the same for its script interpreter — a venv's Python, a
//! `node_modules`), `--sandbox-read` folders, its configured cwd read-write when that lies
//! in one of the installing user's workspaces (else it must be a folder the sandbox shows),
//! a private `/tmp` (its cwd when none is configured, `HOME=/tmp/home`), and the server's
//! network rule. Admins' servers run unsandboxed, as installed by the operator.

use std::path::{Path, PathBuf};

use super::{Prepared, SANDBOX_HOME, SANDBOX_TMP, Sandbox, SpecRequest};

/// A prepared sandbox for one stdio server launch.
pub struct StdioSandbox {
    /// The child's plan (install it on the command, then `finish` the spawn with it).
    pub prepared: Prepared,
    /// Variables the sandbox sets (HOME, TMPDIR, PATH with only visible folders).
    pub env: Vec<(String, String)>,
}

/// The sandbox of a stdio server launch: None when it was installed by an admin (or the
/// sandbox is not enforced and the operator allows unsandboxed processes). Errors (a
/// sentence): a non-admin's server on a host that cannot sandbox, a cwd outside the
/// sandbox, or a sandbox that cannot be prepared.
pub async fn for_stdio_server(
    sandbox: &Sandbox,
    store: &crate::store::Store,
    installed_by: &str,
    command: &str,
    cwd: Option<&str>,
) -> Result<Option<StdioSandbox>, String> {
    if store.user_is_admin(installed_by).await.map_err(|e| e.to_string())? {
        return Ok(None);
    }
    // A cwd inside one of the user's workspaces is theirs to write.
    let workspace: Option<PathBuf> = match cwd {
        Some(dir) => store
            .list_workspaces(installed_by)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|w| PathBuf::from(w.path))
            .find(|w| Path::new(dir).starts_with(w))
            .map(|_| PathBuf::from(dir)),
        None => None,
    };
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let program = resolve(command, &path_env);
    let trees = program.as_deref().map(install_trees).unwrap_or_default();
    let cwd_path = cwd.map_or_else(|| PathBuf::from("/"), PathBuf::from);
    let spec = sandbox
        .spec(&SpecRequest { workspace: workspace.as_deref(), cwd: &cwd_path, is_admin: false, read_only: &trees })
        .map_err(|e| e.message)?;
    if !spec.enforced {
        return Ok(None);
    }
    let run_in = if cwd.is_some() { cwd_path } else { PathBuf::from(SANDBOX_TMP) };
    let prepared = sandbox.prepare(&spec, &run_in, None, &[], false).map_err(|e| e.message)?;
    let Some(prepared) = prepared else { return Ok(None) };
    let kept: Vec<&str> =
        path_env.split(':').filter(|d| d.starts_with('/') && Sandbox::visible_in(&spec, Path::new(d))).collect();
    let env = vec![
        ("HOME".to_owned(), SANDBOX_HOME.to_owned()),
        ("TMPDIR".to_owned(), SANDBOX_TMP.to_owned()),
        ("PATH".to_owned(), kept.join(":")),
    ];
    Ok(Some(StdioSandbox { prepared, env }))
}

/// `command` as a path: itself when it names one, else found on `path`.
fn resolve(command: &str, path: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    path.split(':').filter(|d| d.starts_with('/')).map(|d| Path::new(d).join(command)).find(|p| p.is_file())
}

/// The folders a program needs to read to run: the parent of its `bin/` folder, for the
/// program as named, as resolved, and for its `#!` interpreter. Never `/`, a top-level
/// folder or the server's HOME itself.
fn install_trees(program: &Path) -> Vec<PathBuf> {
    let mut files = vec![program.to_path_buf()];
    if let Ok(real) = std::fs::canonicalize(program) {
        if let Ok(head) = std::fs::read(&real).map(|b| b.into_iter().take(256).collect::<Vec<u8>>())
            && let Some(line) = head.strip_prefix(b"#!")
        {
            let line = String::from_utf8_lossy(line);
            if let Some(interp) = line.lines().next().and_then(|l| l.split_whitespace().next()) {
                files.push(PathBuf::from(interp));
                if let Ok(r) = std::fs::canonicalize(interp) {
                    files.push(r);
                }
            }
        }
        files.push(real);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let mut trees: Vec<PathBuf> = Vec::new();
    for f in files {
        if let Some(tree) = f.parent().and_then(Path::parent)
            && tree.components().count() > 2
            && home.as_deref() != Some(tree)
            && !trees.iter().any(|t| t == tree)
        {
            trees.push(tree.to_path_buf());
        }
    }
    trees
}

#[cfg(test)]
mod tests {
    #[test]
    fn install_trees_stay_below_top_level_folders() {
        let trees = super::install_trees(std::path::Path::new("/usr/bin/env"));
        assert!(trees.is_empty(), "{trees:?}");
    }
}
