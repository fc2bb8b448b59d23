//! Registry: "is there an implementation?"
//!
//! Holds every implementation the runtime can run — public tools, internal primitives,
//! legacy compatibility entries, dynamic capabilities, External MCP projections and
//! skill-private tools — each as an `Arc<dyn Tool>` with its [`ToolSpec`] and compiled input
//! validator. Being registered says nothing about whether the Planner may use a tool; the
//! later stages ([`crate::surface`], [`crate::availability`], [`crate::exposure`]) decide
//! that.

pub mod integers;
pub mod schema;

pub use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
pub use schema::{Dialect, SchemaDialect, SchemaProblem};

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::RwLock;

/// A registered tool with its compiled input validator, or the reason its schema cannot be
/// compiled (then [`crate::availability::evaluate`] answers `schema_unusable`).
#[derive(Clone)]
pub struct Entry {
    /// The implementation.
    pub tool: Arc<dyn Tool>,
    validator: Result<(Arc<jsonschema::Validator>, SchemaDialect), Arc<SchemaProblem>>,
}

impl Entry {
    /// The tool's spec.
    pub fn spec(&self) -> &ToolSpec {
        self.tool.spec()
    }

    /// The dialect the input schema was compiled as, or why it could not be.
    pub fn schema(&self) -> Result<SchemaDialect, &SchemaProblem> {
        match &self.validator {
            Ok((_, d)) => Ok(*d),
            Err(p) => Err(p),
        }
    }

    /// Checks `input` against the tool's JSON Schema; the errors name the failing location.
    /// A tool whose schema is unusable accepts nothing.
    pub fn validate(&self, input: &serde_json::Value) -> Result<(), Vec<String>> {
        let validator = match &self.validator {
            Ok((v, _)) => v,
            Err(problem) => return Err(vec![format!("schema_unusable: {problem}")]),
        };
        let errors: Vec<String> = validator
            .iter_errors(input)
            .take(20)
            .map(|e| {
                let at = e.instance_path().to_string();
                // The message quotes the offending value: long values are cut (a 64 KiB
                // string must not come back in the error).
                let message = crate::evidence::excerpt(&e.to_string(), 300);
                if at.is_empty() { message } else { format!("{at}: {message}") }
            })
            .collect();
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

impl Entry {
    /// Validates `input` ([`Entry::validate`]) and makes its integers ones the tool can read
    /// ([`integers::normalise`]): integral floats at integer positions become integers, and
    /// integers no 64-bit type holds are errors naming the field, as is any integer beyond
    /// ±2^53 ([`mira_core::canonical::inexact_integer`]: the input hash could not tell it
    /// from its neighbours).
    pub fn check_input(&self, input: &mut serde_json::Value) -> Result<(), Vec<String>> {
        self.validate(input)?;
        let mut errors = integers::normalise(&self.spec().input_schema, input);
        // What is approved is the input hash: a number two inputs could share cannot be in it.
        if let Some((pointer, n)) = mira_core::canonical::inexact_integer(input) {
            errors.push(format!(
                "{pointer}: {n} is beyond ±2^53, where canonical JSON (RFC 8785) cannot tell it from its \
                 neighbours, so a call holding it cannot be approved exactly; send it as a string"
            ));
        }
        if errors.is_empty() { Ok(()) } else { Err(errors) }
    }
}

/// Why a tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Another tool already has this id.
    #[error("tool {0} is already registered")]
    Duplicate(String),
}

/// Explains ids of one family (by prefix) that the registry does not hold, or adds detail to
/// those it does: External MCP projections say which MCP stage keeps them out.
pub trait Explainer: Send + Sync {
    /// Why `id` is not registered for `user_id` (a stable code and a sentence naming the
    /// blocking stage), when this explainer knows the id's family.
    fn why_absent(&self, id: &str, user_id: &str) -> Option<(String, String)>;
    /// Extra stage detail for `id` as seen by `user_id` (a JSON document), if any.
    fn detail(&self, id: &str, user_id: &str) -> Option<serde_json::Value>;
    /// Refuses a frozen call of `id` (its canonical `input`) that no longer matches what the
    /// tool offers now — an External MCP tool whose definition changed since the call was
    /// frozen answers `stale_definition`. Asked at grant and before execution, whether or not
    /// the tool is registered now. The default accepts.
    fn check_frozen(&self, _id: &str, _input: &serde_json::Value) -> Result<(), ToolError> {
        Ok(())
    }
}

/// The set of implementations, changed only by [`Registry::register`] and
/// [`Registry::unregister`]. `version` increases on every change, and
/// [`Registry::subscribe`] wakes watchers (the tool index) after each one.
#[derive(Default)]
pub struct Registry {
    inner: RwLock<Inner>,
    explainers: RwLock<Vec<(String, Weak<dyn Explainer>)>>,
    changes: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    tools: BTreeMap<String, Entry>,
    version: u64,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool, its input schema compiled in its own dialect ([`schema::compile`]).
    /// A schema that compiles in no dialect does not fail the registration: the entry is
    /// kept with the problem, and availability says `schema_unusable` for this tool alone.
    /// Fails on a duplicate id.
    pub fn register(&self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let spec = tool.spec();
        let validator = match schema::compile(&spec.input_schema) {
            Ok(c) => Ok((Arc::new(c.validator), c.dialect)),
            Err(problem) => {
                tracing::warn!(tool = %spec.id, %problem, "input schema unusable; the tool stays unavailable");
                Err(Arc::new(problem))
            }
        };
        let id = spec.id.clone();
        let mut inner = self.inner.write();
        if inner.tools.contains_key(&id) {
            return Err(RegistryError::Duplicate(id));
        }
        inner.tools.insert(id, Entry { tool, validator });
        inner.version += 1;
        self.changes.send_replace(inner.version);
        Ok(())
    }

    /// Removes a tool (dynamic capabilities and MCP projections come and go). True when it
    /// was there.
    pub fn unregister(&self, id: &str) -> bool {
        let mut inner = self.inner.write();
        let removed = inner.tools.remove(id).is_some();
        if removed {
            inner.version += 1;
            self.changes.send_replace(inner.version);
        }
        removed
    }

    /// The entry for `id` if registered and visible to `user_id` (tools with an owner are
    /// visible to that owner only).
    pub fn get(&self, id: &str, user_id: &str) -> Option<Entry> {
        self.inner.read().tools.get(id).filter(|e| e.spec().visible_to(user_id)).cloned()
    }

    /// The entry for `id` whoever owns it (for the harness, which runs stored invocations).
    pub fn get_any(&self, id: &str) -> Option<Entry> {
        self.inner.read().tools.get(id).cloned()
    }

    /// Every entry visible to `user_id`, in id order.
    pub fn visible_to(&self, user_id: &str) -> Vec<Entry> {
        self.inner.read().tools.values().filter(|e| e.spec().visible_to(user_id)).cloned().collect()
    }

    /// Every entry, in id order.
    pub fn all(&self) -> Vec<Entry> {
        self.inner.read().tools.values().cloned().collect()
    }

    /// Adds an explainer for ids starting with `prefix` (held weakly: it lives as long as its
    /// owner).
    pub fn add_explainer(&self, prefix: &str, explainer: Weak<dyn Explainer>) {
        self.explainers.write().push((prefix.to_owned(), explainer));
    }

    /// The explainer of `id`'s family, if one is alive.
    pub fn explainer_for(&self, id: &str) -> Option<Arc<dyn Explainer>> {
        self.explainers.read().iter().filter(|(p, _)| id.starts_with(p.as_str())).find_map(|(_, e)| e.upgrade())
    }

    /// Asks the explainer of `tool_id`'s family whether a frozen call (its canonical input as
    /// stored, JSON text) may still run ([`Explainer::check_frozen`]). Unparsable input passes
    /// here (execution refuses it as `corrupt_input`).
    pub fn check_frozen(&self, tool_id: &str, input: &str) -> Result<(), ToolError> {
        let Some(explainer) = self.explainer_for(tool_id) else { return Ok(()) };
        match serde_json::from_str::<serde_json::Value>(input) {
            Ok(v) => explainer.check_frozen(tool_id, &v),
            Err(_) => Ok(()),
        }
    }

    /// Increases on every registration change.
    pub fn version(&self) -> u64 {
        self.inner.read().version
    }

    /// A receiver that sees the registry version after every change (the value is the
    /// newest version; intermediate ones may be skipped).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}
