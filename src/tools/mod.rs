//! Tool implementations, one folder per domain (Read, Edit, Codebase, Search, Terminal; the
//! External MCP projections are [`crate::mcp::tool`]). [`register_core`] puts every core tool
//! of this build into a registry.

pub mod browser;
pub mod codebase;
pub mod expert;
pub mod github;
pub mod mail;
pub mod search;
pub mod terminal;

/// Read, Edit and the typed inputs live in `mira-tools` (no axum, no sqlx), which a remote
/// runner shares; they keep their paths here.
pub use mira_tools::{edit, input, read};

use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::registry::{Registry, RegistryError};
use crate::store::Store;

/// What tool implementations may hold on to: the store (for their own tables), the data
/// directory (for caches and indexes) and the server's shutdown signal.
#[derive(Clone)]
pub struct ToolDeps {
    /// The store.
    pub store: Store,
    /// The data directory.
    pub data_dir: PathBuf,
    /// Cancelled when the server stops; background work of tools must end with it.
    pub shutdown: CancellationToken,
    /// The Search tools' settings (`--search-*`).
    pub search: search::config::SearchConfig,
    /// The terminal's settings (`--terminal-*`).
    pub terminal: terminal::host::TerminalConfig,
    /// This data directory's stable node id (who holds which PTYs).
    pub node_id: String,
    /// The sandbox of the processes tools start for users.
    pub sandbox: Arc<crate::sandbox::Sandbox>,
    /// The users' connections (GitHub, mail…) the dynamic tools' availability reads.
    pub connections: Arc<crate::connections::ConnectionHub>,
    /// Whether non-admins' URLs may reach internal addresses (`--allow-internal-urls`).
    pub allow_internal_urls: bool,
    /// The managed browser's settings (`--browser-*`).
    pub browser: browser::BrowserSettings,
    /// The users' attached browsers (`browser` connections), shared with their driver.
    pub attached: Arc<browser::attached::AttachedBrowsers>,
}

/// The drivers of every connection kind this build knows ([`crate::connections::Driver`]).
pub fn connection_drivers(
    attached: &Arc<browser::attached::AttachedBrowsers>,
) -> Vec<Arc<dyn crate::connections::Driver>> {
    vec![github::driver(), mail::driver(), expert::driver(), browser::attached::driver(attached)]
}

/// Handles to the state of core tools that HTTP resources share with them.
#[derive(Clone)]
pub struct CoreTools {
    /// Provider connections, news sources and the collector (`/v1/search/…`, `/v1/news/…`).
    pub search: Arc<search::SearchHub>,
    /// Live terminal sessions (`/v1/terminal-sessions`).
    pub terminal: Arc<terminal::host::TerminalHost>,
    /// The managed browser (`/readyz` reports it).
    pub browser: Arc<browser::manager::BrowserManager>,
}

/// Registers the core tools and their legacy compatibility entries, and starts the
/// background work of those that have some (the News Hub collector, provider health
/// checks), which ends with `deps.shutdown`.
pub fn register_core(registry: &Registry, deps: &ToolDeps) -> Result<CoreTools, RegistryError> {
    let discover = Arc::new(read::discover::ReadDiscover::new());
    let open = Arc::new(read::open::ReadOpen::new());
    registry.register(discover.clone())?;
    registry.register(Arc::new(read::grep::Grep::new()))?;
    registry.register(open.clone())?;
    for legacy in read::legacy::entries(discover, open) {
        registry.register(Arc::new(legacy))?;
    }
    let graphs = Arc::new(codebase::index::CodeGraphs::new(
        deps.data_dir.clone(),
        deps.shutdown.clone(),
        codebase::index::IndexConfig::default(),
    ));
    registry.register(Arc::new(codebase::CodebaseExplore::new(graphs.clone())))?;
    let edits: [Arc<dyn crate::registry::Tool>; 4] = [
        Arc::new(edit::write_file::WriteFile::new()),
        Arc::new(edit::replace_block::ReplaceBlock::new()),
        Arc::new(edit::delete_path::DeletePath::new()),
        Arc::new(edit::move_path::MovePath::new()),
    ];
    for tool in edits {
        registry.register(Arc::new(codebase::ReportsChanges::new(tool, graphs.clone())))?;
    }
    let search = search::register(registry, deps)?;
    github::register(registry, deps)?;
    mail::register(registry, deps)?;
    expert::register(registry, deps)?;
    let browser = browser::manager::BrowserManager::new(
        deps.browser.clone(),
        &deps.data_dir,
        deps.store.clone(),
        deps.allow_internal_urls,
        {
            let sandbox = deps.sandbox.clone();
            Arc::new(move || sandbox.service_ports())
        },
    );
    // The managed Chromium's process tree gets a cgroup of its own below this node's groups:
    // the sandbox's probe when it made one, else a probe of its own (the sandbox is off, or
    // Landlock is missing, and did not look).
    let probed = deps.sandbox.report().host.cgroup;
    browser.set_cgroups(if probed.membership() {
        probed
    } else {
        crate::sandbox::cgroup::CgroupSupport::probe(&deps.node_id)
    });
    browser::register(registry, &browser, &deps.data_dir)?;
    browser::attached::register(
        registry,
        &deps.connections,
        &deps.attached,
        &browser,
        &deps.data_dir,
        deps.shutdown.clone(),
    )?;
    browser.spawn_reaper(deps.shutdown.clone());
    let terminal = terminal::host::TerminalHost::new(
        deps.store.clone(),
        deps.node_id.clone(),
        deps.terminal.clone(),
        deps.sandbox.clone(),
        deps.shutdown.clone(),
    );
    registry.register(Arc::new(terminal::TerminalSession::new(terminal.clone())))?;
    Ok(CoreTools { search, terminal, browser })
}
