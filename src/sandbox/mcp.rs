//! The sandbox of stdio MCP servers installed by non-admin users.
//!
//! Such a server is a process on the server host started for a user, so it gets the same
//! sandbox as their terminal sessions, minus a workspace: the system read-only, its own
//! install tree read-only (the folder above the `bin/` folder of the command's real path and
//! of its `#!` interpreter's, never one that holds a workspace or the server's data, nor one
//! inside another user's workspace), `--sandbox-read` folders, its configured cwd read-write
//! — which must be, by its real path (`..` and symbolic links resolved), one of the
//! installing user's workspaces or a folder in one, and not in another user's workspace
//! nested there — a private `/tmp` (its cwd when none is configured, `HOME=/tmp/home`), the
//! server's network rule, its own PID and IPC namespaces, and a cgroup like a terminal
//! session's where the host gives one. Other users' workspaces inside what it sees are
//! covered. Admins' servers run unsandboxed, as installed by the operator.
//!
//! Which commands a non-admin may launch is `--mcp-stdio-allow` ([`allowed_program`]),
//! matched on the command's real path, at install and again at every launch; the process
//! runs that real path.

use std::path::{Path, PathBuf};

use super::{Prepared, SANDBOX_HOME, SANDBOX_TMP, Sandbox, SpecRequest};

/// A prepared sandbox for one stdio server launch.
pub struct StdioSandbox {
    /// The child's plan (install it on the command, then `finish` the spawn with it).
    pub prepared: Prepared,
    /// Variables the sandbox sets (HOME, TMPDIR, PATH with only visible folders).
    pub env: Vec<(String, String)>,
    /// The program to run: the real path the allow-list admitted.
    pub program: PathBuf,
}

/// The program a command names: `run`, the path to execute — its folder resolved to a real
/// path, its file name kept (a virtualenv's `bin/python` is a symlink that must be run by
/// its own name for Python to find the virtualenv) — and `real`, the file it finally is
/// (every link followed), which the allow-list is matched against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The path executed.
    pub run: PathBuf,
    /// Its real path.
    pub real: PathBuf,
}

/// The program `command` names: a path is taken as it is (it must be absolute), a bare
/// name is looked up in the absolute folders of `path_env`. None when it names no regular
/// file.
pub fn resolve_program(command: &str, path_env: &str) -> Option<Program> {
    let found = if command.contains('/') {
        Some(PathBuf::from(command)).filter(|p| p.is_absolute())?
    } else {
        path_env.split(':').filter(|d| d.starts_with('/')).map(|d| Path::new(d).join(command)).find(|p| p.is_file())?
    };
    let real = std::fs::canonicalize(&found).ok().filter(|p| p.is_file())?;
    let name = found.file_name()?;
    let folder = std::fs::canonicalize(found.parent()?).ok()?;
    Some(Program { run: folder.join(name), real })
}

/// Whether the allow-list `allow` (`--mcp-stdio-allow`) lets a non-admin launch `command`,
/// and the real path of the program it runs. Entries are matched on real paths, never on a
/// file name: an entry with a `/` names that file (its real path); a bare entry (`node`)
/// names the file it resolves to through the server's `PATH` (`path_env`), and only while
/// that file lies outside every workspace in `workspaces` (so a user's own `node` script
/// never passes for it); `*` allows any command that names a file. Errors are sentences.
pub fn allowed_program(
    allow: &[String],
    command: &str,
    path_env: &str,
    workspaces: &[PathBuf],
) -> Result<Program, String> {
    let Some(program) = resolve_program(command, path_env) else {
        return Err(format!(
            "`{command}` names no program on the server host (an absolute path or a name on its PATH)"
        ));
    };
    let in_workspace = |p: &Path| workspaces.iter().any(|w| p.starts_with(w));
    let admitted = allow.iter().any(|entry| {
        if entry == "*" {
            return true;
        }
        let real = if entry.contains('/') {
            std::fs::canonicalize(entry).ok()
        } else {
            resolve_program(entry, path_env).map(|p| p.real).filter(|p| !in_workspace(p))
        };
        real.is_some_and(|r| r == program.real)
    });
    if admitted {
        Ok(program)
    } else {
        Err(format!(
            "`{command}` (the program {}) is not one the deployment lets non-admins run \
             (--mcp-stdio-allow / MIRA_MCP_STDIO_ALLOW, matched on real paths)",
            program.real.display()
        ))
    }
}

/// The real paths of the host's workspaces: those `user` may use (theirs and shared ones),
/// and every other user's (also as registered, in case they do not resolve here).
pub async fn host_workspaces(store: &crate::store::Store, user: &str) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    let own: Vec<PathBuf> = store
        .list_workspaces(user)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|w| w.device_id.is_none())
        .filter_map(|w| std::fs::canonicalize(&w.path).ok())
        .collect();
    let mut others: Vec<PathBuf> = Vec::new();
    for p in store.other_users_workspace_paths(user).await.map_err(|e| e.to_string())? {
        let raw = PathBuf::from(&p);
        if let Ok(real) = std::fs::canonicalize(&raw)
            && real != raw
        {
            others.push(real);
        }
        others.push(raw);
    }
    Ok((own, others))
}

/// The sandbox of a stdio server launch: None when it was installed by an admin (or the
/// sandbox is not enforced and the operator allows unsandboxed processes). Errors (a
/// sentence): a command the allow-list (`allow`) does not admit, a non-admin's server on a
/// host that cannot sandbox, a cwd outside the user's workspaces (or hidden), or a sandbox
/// that cannot be prepared.
pub async fn for_stdio_server(
    sandbox: &Sandbox,
    store: &crate::store::Store,
    installed_by: &str,
    allow: &[String],
    command: &str,
    cwd: Option<&str>,
) -> Result<Option<StdioSandbox>, String> {
    if store.user_is_admin(installed_by).await.map_err(|e| e.to_string())? {
        return Ok(None);
    }
    let (own, others) = host_workspaces(store, installed_by).await?;
    let everyone: Vec<PathBuf> = own.iter().chain(&others).cloned().collect();
    let path_env = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    // Checked again at every launch: what a path leads to can change after the install.
    let program = allowed_program(allow, command, &path_env, &everyone)?;
    let workspace = match cwd {
        Some(dir) => Some(cwd_in_workspaces(dir, &own, &others)?),
        None => None,
    };
    let trees = install_trees(&program, &own, &others, sandbox.secrets());
    let cwd_path = workspace.clone().unwrap_or_else(|| PathBuf::from("/"));
    let spec = sandbox
        .spec(&SpecRequest { workspace: workspace.as_deref(), cwd: &cwd_path, is_admin: false, read_only: &trees })
        .map_err(|e| e.message)?;
    if !spec.enforced {
        return Ok(None);
    }
    let run_in = workspace.unwrap_or_else(|| PathBuf::from(SANDBOX_TMP));
    let cgroup_id = crate::ids::new_id("mcpp");
    let prepared =
        sandbox.prepare(&spec, &run_in, Some(&cgroup_id), &others, false, Vec::new()).map_err(|e| e.message)?;
    let Some(prepared) = prepared else { return Ok(None) };
    let kept: Vec<&str> =
        path_env.split(':').filter(|d| d.starts_with('/') && Sandbox::visible_in(&spec, Path::new(d))).collect();
    let env = vec![
        ("HOME".to_owned(), SANDBOX_HOME.to_owned()),
        ("TMPDIR".to_owned(), SANDBOX_TMP.to_owned()),
        ("PATH".to_owned(), kept.join(":")),
    ];
    Ok(Some(StdioSandbox { prepared, env, program: program.run }))
}

/// The real path of a non-admin's configured cwd `dir`, when it is one of their workspaces
/// (`own`, real paths) or a folder inside one, and not inside another user's workspace
/// (`others`) nested deeper there.
pub fn cwd_in_workspaces(dir: &str, own: &[PathBuf], others: &[PathBuf]) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(dir).map_err(|e| format!("the server's cwd {dir} cannot be resolved: {e}"))?;
    if !real.is_dir() {
        return Err(format!("the server's cwd {dir} is not a folder"));
    }
    let depth = |p: &PathBuf| p.components().count();
    let Some(mine) = own.iter().filter(|w| real.starts_with(w)).map(depth).max() else {
        return Err(format!("the server's cwd {dir} (really {}) is not inside one of your workspaces", real.display()));
    };
    if others.iter().any(|o| real.starts_with(o) && depth(o) > mine) {
        return Err(format!("the server's cwd {dir} (really {}) is inside another user's workspace", real.display()));
    }
    Ok(real)
}

/// The folders a program needs to read to run: the parent of the `bin/` folder, for the
/// program as run (its folder's real path: a virtualenv), its real path, and its `#!`
/// interpreter's real path. Never `/`, a top-level folder, the server's HOME, a folder that
/// holds a workspace (`own`, `others`) or a secret (the data dir) or lies inside one, nor one
/// inside another user's workspace.
fn install_trees(program: &Program, own: &[PathBuf], others: &[PathBuf], secrets: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = vec![program.run.clone(), program.real.clone()];
    if let Ok(head) = std::fs::read(&program.real).map(|b| b.into_iter().take(256).collect::<Vec<u8>>())
        && let Some(line) = head.strip_prefix(b"#!")
    {
        let line = String::from_utf8_lossy(line);
        if let Some(interp) = line.lines().next().and_then(|l| l.split_whitespace().next())
            && let Ok(real) = std::fs::canonicalize(interp)
        {
            files.push(real);
        }
    }
    let home = std::env::var_os("HOME").and_then(|h| std::fs::canonicalize(h).ok());
    let mut trees: Vec<PathBuf> = Vec::new();
    for f in files {
        let Some(tree) = f.parent().and_then(Path::parent) else { continue };
        let holds = |p: &PathBuf| p.starts_with(tree);
        let allowed = tree.components().count() > 2
            && home.as_deref() != Some(tree)
            && !own.iter().chain(others).any(holds)
            && !others.iter().any(|o| tree.starts_with(o))
            && !secrets.iter().any(|s| holds(s) || tree.starts_with(s));
        if allowed && !trees.iter().any(|t| t == tree) {
            trees.push(tree.to_path_buf());
        }
    }
    trees
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn install_trees_stay_below_top_level_folders() {
        let trees = install_trees(&resolve_program("/usr/bin/env", "").unwrap(), &[], &[], &[]);
        assert!(trees.is_empty(), "{trees:?}");
    }

    /// A scratch layout: `<base>/ws/alice` (alice's workspace, holding a `node` script and a
    /// symlink to the data dir), `<base>/ws/bob`, `<base>/data` (the data dir),
    /// `<base>/tools/bin/server` (a real tool outside every workspace).
    struct Layout {
        _dir: tempfile::TempDir,
        base: PathBuf,
        alice: PathBuf,
        bob: PathBuf,
        data: PathBuf,
        tool: PathBuf,
    }

    fn layout() -> Layout {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (alice, bob, data) = (base.join("ws/alice"), base.join("ws/bob"), base.join("data"));
        for d in [&alice, &bob, &data, &base.join("tools/bin"), &alice.join("bin")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(data.join("admin.token"), "t").unwrap();
        let tool = base.join("tools/bin/server");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::write(alice.join("bin/node"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink(&data, alice.join("to-data")).unwrap();
        std::os::unix::fs::symlink(&bob, alice.join("to-bob")).unwrap();
        Layout { _dir: dir, base, alice, bob, data, tool }
    }

    /// A cwd that only looks like it is in the workspace — `..` out of it, or a symbolic link
    /// the user's terminal made inside it — is refused by its real path; a real folder inside
    /// the workspace is granted as its real path.
    #[test]
    fn a_cwd_is_judged_by_its_real_path() {
        let l = layout();
        let own = vec![l.alice.clone()];
        let others = vec![l.bob.clone()];
        let traversal = format!("{}/../../data", l.alice.display());
        assert!(Path::new(&traversal).starts_with(&l.alice), "the text still starts with the workspace");
        for dir in [traversal, format!("{}/to-data", l.alice.display()), format!("{}/to-bob", l.alice.display())] {
            let r = cwd_in_workspaces(&dir, &own, &others);
            assert!(r.is_err(), "{dir} was granted: {r:?}");
        }
        assert_eq!(cwd_in_workspaces(&format!("{}/bin/", l.alice.display()), &own, &others), Ok(l.alice.join("bin")));
        // Bob's workspace nested in a shared one alice may use is still bob's.
        let shared = vec![l.base.join("ws")];
        assert!(cwd_in_workspaces(l.bob.to_str().unwrap(), &shared, &others).is_err());
    }

    /// The allow-list matches real paths: a user's script named like an allowed command does
    /// not pass for it, by name or through a symlink; a bare entry stands for what it
    /// resolves to on the server's PATH, and not when that lies in a workspace.
    #[test]
    fn the_allow_list_matches_real_paths_not_names() {
        let l = layout();
        let workspaces = vec![l.alice.clone(), l.bob.clone()];
        let user_node = l.alice.join("bin/node");
        let path_env = format!("{}:{}", l.base.join("tools/bin").display(), "/usr/bin:/bin");
        let allow = vec!["node".to_owned(), l.tool.to_string_lossy().into_owned()];
        assert!(allowed_program(&allow, user_node.to_str().unwrap(), &path_env, &workspaces).is_err());
        std::os::unix::fs::symlink(&user_node, l.alice.join("server")).unwrap();
        assert!(allowed_program(&allow, l.alice.join("server").to_str().unwrap(), &path_env, &workspaces).is_err());
        // The real tool, by path or by its name on PATH when the entry is bare.
        let real = |r: Result<Program, String>| r.map(|p| p.real);
        assert_eq!(real(allowed_program(&allow, l.tool.to_str().unwrap(), &path_env, &workspaces)), Ok(l.tool.clone()));
        let bare = vec!["server".to_owned()];
        assert_eq!(real(allowed_program(&bare, "server", &path_env, &workspaces)), Ok(l.tool.clone()));
        // A bare entry that resolves into a workspace admits nothing.
        let in_ws = format!("{}:/usr/bin:/bin", l.alice.join("bin").display());
        assert!(allowed_program(&["node".to_owned()], "node", &in_ws, &workspaces).is_err());
        assert!(allowed_program(&["*".to_owned()], "relative/x", &path_env, &workspaces).is_err());
    }

    /// Install trees come from the real program only, and never hold a workspace or the data
    /// dir (a command `<base>/ws/alice/node` would otherwise expose all of `<base>/ws`).
    #[test]
    fn install_trees_never_hold_a_workspace_or_the_data_dir() {
        let l = layout();
        let own = vec![l.alice.clone()];
        let others = vec![l.bob.clone()];
        let node = l.alice.join("node");
        std::fs::write(&node, "#!/bin/sh\n").unwrap();
        let trees = |p: &Path, secrets: &[PathBuf]| {
            install_trees(&resolve_program(p.to_str().unwrap(), "").unwrap(), &own, &others, secrets)
        };
        assert!(trees(&node, std::slice::from_ref(&l.data)).is_empty());
        assert_eq!(trees(&l.tool, std::slice::from_ref(&l.data)), vec![l.base.join("tools")]);
        // A virtualenv's interpreter, a link to a system program: its own tree is shown.
        let venv_python = l.base.join("venv/bin/python");
        std::fs::create_dir_all(venv_python.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&l.tool, &venv_python).unwrap();
        assert_eq!(trees(&venv_python, &[]), vec![l.base.join("venv"), l.base.join("tools")]);
        let in_data = l.data.join("x/bin/tool");
        std::fs::create_dir_all(in_data.parent().unwrap()).unwrap();
        std::fs::write(&in_data, "").unwrap();
        assert!(trees(&in_data, std::slice::from_ref(&l.data)).is_empty());
        let bobs = l.bob.join("p/bin/tool");
        std::fs::create_dir_all(bobs.parent().unwrap()).unwrap();
        std::fs::write(&bobs, "").unwrap();
        assert!(trees(&bobs, &[]).is_empty());
    }
}
