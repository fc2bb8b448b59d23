//! Legacy read entries: `read_list`, `read_locate`, `read_extract`, `read_slice`, `read`.
//!
//! Old persisted calls and internal primitives still work through them: each maps its old
//! input shape onto a public Read tool and runs that tool. They are registered with kind
//! `legacy`, never on the public surface and never exposed; a Planner call to one is
//! answered 409 `not_public` naming the replacement.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use mira_core::tool::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};

/// Maps an old input shape to the replacement's input.
type Mapper = fn(&Value) -> Value;

/// A legacy entry delegating to a public tool.
pub struct Legacy {
    spec: ToolSpec,
    target: Arc<dyn Tool>,
    map: Mapper,
}

/// The five legacy entries, delegating to `read_discover` and `read_open`.
pub fn entries(discover: Arc<dyn Tool>, open: Arc<dyn Tool>) -> Vec<Legacy> {
    vec![
        legacy("read_list", "List a folder (legacy; use read_discover)", &discover, map_list),
        legacy("read_locate", "Find files by name (legacy; use read_discover)", &discover, map_locate),
        legacy("read_extract", "Extract a line range (legacy; use read_open)", &open, map_range),
        legacy("read_slice", "Read a slice of a file (legacy; use read_open)", &open, map_range),
        legacy("read", "Read a file (legacy; use read_open)", &open, map_read),
    ]
}

fn legacy(id: &str, description: &str, target: &Arc<dyn Tool>, map: Mapper) -> Legacy {
    Legacy {
        spec: ToolSpec {
            id: id.into(),
            kind: ToolKind::Legacy,
            domain: "read".into(),
            title: id.into(),
            description: description.into(),
            input_schema: json!({"type": "object"}),
            requires_approval: false,
            capability: Some("fs.read".into()),
            replacement: Some(target.spec().id.clone()),
            owner: None,
        },
        target: Arc::clone(target),
        map,
    }
}

fn pick(input: &Value, names: &[&str]) -> Option<Value> {
    names.iter().find_map(|n| input.get(*n).cloned())
}

fn object(pairs: Vec<(&str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v))).collect();
    Value::Object(map)
}

fn map_list(input: &Value) -> Value {
    object(vec![
        ("path", pick(input, &["path", "dir", "directory"])),
        ("max_depth", pick(input, &["depth", "max_depth"])),
    ])
}

fn map_locate(input: &Value) -> Value {
    object(vec![("query", pick(input, &["name", "query", "pattern"])), ("path", pick(input, &["path", "dir"]))])
}

fn map_range(input: &Value) -> Value {
    object(vec![
        ("path", pick(input, &["path", "file"])),
        ("start_line", pick(input, &["start_line", "start", "from", "line"])),
        ("end_line", pick(input, &["end_line", "end", "to"])),
    ])
}

fn map_read(input: &Value) -> Value {
    object(vec![("path", pick(input, &["path", "file"]))])
}

#[async_trait]
impl Tool for Legacy {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        self.target.prepare((self.map)(&input), ctx).await
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let mut out = self.target.execute(input, ctx).await?;
        if let Value::Object(map) = &mut out.output {
            map.insert("served_by".into(), json!(self.target.spec().id));
        }
        Ok(out)
    }
}
