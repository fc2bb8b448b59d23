//! Input schemas in the dialect they are written in.
//!
//! Tool schemas come from everywhere — the runtime's own tools, MCP servers written with
//! zod (draft-07), pydantic (2020-12 without `$schema`), hand-written draft-04 — and one
//! that does not compile must never take its neighbours down. [`compile`] picks the
//! dialect like this:
//!
//! 1. A schema that declares `$schema` is compiled as that dialect: draft-04, -06, -07,
//!    2019-09 or 2020-12 (`http` or `https`, with or without the trailing `#`; the
//!    version-less `…/schema` means the newest). Any other `$schema` is unusable (this
//!    server fetches no meta-schema).
//! 2. A schema without `$schema` is JSON Schema 2020-12, the default of MCP 2025-11-25
//!    ("SEP-1613"). When it carries draft-04 forms — a boolean `exclusiveMinimum` /
//!    `exclusiveMaximum`, or an `id` (not `$id`) naming the root — it is tried as draft-04
//!    first. When it does not compile as 2020-12, the older dialects are tried, newest
//!    first (2019-09, draft-07, -06, -04), so `"items": [...]` tuples and other pre-2020
//!    forms are read as their authors meant.
//!
//! A schema that compiles under none of them is a [`SchemaProblem`]: the registry keeps the
//! tool, and availability answers `schema_unusable` with the problem, for that one tool only.

use jsonschema::Draft;
use serde::Serialize;
use serde_json::Value;

/// A JSON Schema dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub enum Dialect {
    /// draft-04 (`http://json-schema.org/draft-04/schema#`).
    #[serde(rename = "draft-04")]
    Draft04,
    /// draft-06.
    #[serde(rename = "draft-06")]
    Draft06,
    /// draft-07.
    #[serde(rename = "draft-07")]
    Draft07,
    /// 2019-09.
    #[serde(rename = "2019-09")]
    Draft201909,
    /// 2020-12.
    #[serde(rename = "2020-12")]
    Draft202012,
}

impl Dialect {
    /// The name used in messages and in `GET /v1/mcp/servers/{id}`: `draft-04` … `2020-12`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Draft04 => "draft-04",
            Dialect::Draft06 => "draft-06",
            Dialect::Draft07 => "draft-07",
            Dialect::Draft201909 => "2019-09",
            Dialect::Draft202012 => "2020-12",
        }
    }

    fn draft(self) -> Draft {
        match self {
            Dialect::Draft04 => Draft::Draft4,
            Dialect::Draft06 => Draft::Draft6,
            Dialect::Draft07 => Draft::Draft7,
            Dialect::Draft201909 => Draft::Draft201909,
            Dialect::Draft202012 => Draft::Draft202012,
        }
    }

    fn of_uri(uri: &str) -> Option<Dialect> {
        match Draft::from_schema_uri(uri) {
            Draft::Draft4 => Some(Dialect::Draft04),
            Draft::Draft6 => Some(Dialect::Draft06),
            Draft::Draft7 => Some(Dialect::Draft07),
            Draft::Draft201909 => Some(Dialect::Draft201909),
            Draft::Draft202012 => Some(Dialect::Draft202012),
            _ => None,
        }
    }
}

/// How a schema was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SchemaDialect {
    /// The dialect it compiled as.
    pub dialect: Dialect,
    /// True when the schema named it in `$schema`; false when it was inferred.
    pub declared: bool,
}

/// A compiled schema.
pub struct Compiled {
    /// The validator.
    pub validator: jsonschema::Validator,
    /// How it was read.
    pub dialect: SchemaDialect,
}

/// Why a schema cannot be used: one sentence naming the problem (the declared or tried
/// dialects and the compiler's message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaProblem(pub String);

/// Newest first: the order undeclared schemas fall back through.
const FALLBACK: [Dialect; 5] =
    [Dialect::Draft202012, Dialect::Draft201909, Dialect::Draft07, Dialect::Draft06, Dialect::Draft04];

/// Why a schema does not compile in one dialect: the compiler's message (cut to 300
/// characters), located in the schema when the compiler says where.
#[derive(Debug, thiserror::Error)]
enum BuildError {
    /// The compiler named no place in the schema.
    #[error("{message}")]
    Whole { message: String },
    /// Meta-schema errors locate the offending keyword in the schema itself.
    #[error("at {at}: {message}")]
    At { at: String, message: String },
}

fn build(schema: &Value, dialect: Dialect) -> Result<jsonschema::Validator, BuildError> {
    jsonschema::options().with_draft(dialect.draft()).build(schema).map_err(|e| {
        let at = e.instance_path().to_string();
        let message = crate::evidence::excerpt(&e.to_string(), 300);
        if at.is_empty() { BuildError::Whole { message } } else { BuildError::At { at, message } }
    })
}

/// Compiles `schema` in its dialect (module docs). Pure and synchronous: no meta-schema or
/// `$ref` is fetched from anywhere.
pub fn compile(schema: &Value) -> Result<Compiled, SchemaProblem> {
    if let Some(declared) = schema.as_object().and_then(|o| o.get("$schema")) {
        let Some(uri) = declared.as_str() else {
            return Err(SchemaProblem(format!("$schema must be a URI string, not {declared}")));
        };
        let Some(dialect) = Dialect::of_uri(uri) else {
            return Err(SchemaProblem(format!(
                "$schema {uri:?} is not a JSON Schema dialect this server reads (draft-04, draft-06, draft-07, \
                 2019-09, 2020-12); custom meta-schemas are not fetched"
            )));
        };
        return build(schema, dialect)
            .map(|validator| Compiled { validator, dialect: SchemaDialect { dialect, declared: true } })
            .map_err(|e| {
                SchemaProblem(format!("the schema declares {} but does not compile as it: {e}", dialect.as_str()))
            });
    }
    let draft04_first = has_draft04_forms(schema);
    let order = draft04_first
        .then_some(Dialect::Draft04)
        .into_iter()
        .chain(FALLBACK.into_iter().filter(|d| !(draft04_first && *d == Dialect::Draft04)));
    let mut first_error: Option<(Dialect, BuildError)> = None;
    for dialect in order {
        match build(schema, dialect) {
            Ok(validator) => return Ok(Compiled { validator, dialect: SchemaDialect { dialect, declared: false } }),
            Err(e) => {
                first_error.get_or_insert((dialect, e));
            }
        }
    }
    let (dialect, e) =
        first_error.map(|(d, e)| (d, e.to_string())).unwrap_or((Dialect::Draft202012, "no dialect was tried".into()));
    Err(SchemaProblem(format!(
        "the schema declares no $schema and compiles under no JSON Schema dialect (2020-12, 2019-09, draft-07, \
         draft-06, draft-04); as {}: {e}",
        dialect.as_str()
    )))
}

/// Whether an undeclared schema shows draft-04 forms: a boolean `exclusiveMinimum` or
/// `exclusiveMaximum` in any subschema, or a string `id` naming the root without `$id`.
pub fn has_draft04_forms(schema: &Value) -> bool {
    let root_id =
        schema.as_object().is_some_and(|o| o.get("id").is_some_and(Value::is_string) && !o.contains_key("$id"));
    root_id || boolean_exclusive(schema, 0)
}

fn boolean_exclusive(v: &Value, depth: usize) -> bool {
    if depth > 64 {
        return false;
    }
    match v {
        Value::Object(o) => {
            ["exclusiveMinimum", "exclusiveMaximum"].iter().any(|k| o.get(*k).is_some_and(Value::is_boolean))
                || o.iter().any(|(k, child)| {
                    // Data, not subschemas: a default or an example may hold anything.
                    !matches!(k.as_str(), "enum" | "const" | "default" | "examples" | "example")
                        && boolean_exclusive(child, depth + 1)
                })
        }
        Value::Array(a) => a.iter().any(|child| boolean_exclusive(child, depth + 1)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dialect(schema: &Value) -> SchemaDialect {
        match compile(schema) {
            Ok(c) => c.dialect,
            Err(e) => panic!("{schema} does not compile: {e}"),
        }
    }

    fn valid(schema: &Value, input: &Value) -> bool {
        match compile(schema) {
            Ok(c) => c.validator.is_valid(input),
            Err(e) => panic!("{schema} does not compile: {e}"),
        }
    }

    #[test]
    fn declared_dialects_are_used() {
        for (uri, d) in [
            ("http://json-schema.org/draft-04/schema#", Dialect::Draft04),
            ("http://json-schema.org/draft-06/schema#", Dialect::Draft06),
            ("http://json-schema.org/draft-07/schema#", Dialect::Draft07),
            ("https://json-schema.org/draft/2019-09/schema", Dialect::Draft201909),
            ("https://json-schema.org/draft/2020-12/schema", Dialect::Draft202012),
        ] {
            let s = json!({"$schema": uri, "type": "object", "properties": {"n": {"type": "integer"}}});
            assert_eq!(dialect(&s), SchemaDialect { dialect: d, declared: true }, "{uri}");
            assert!(!valid(&s, &json!({"n": "x"})));
        }
    }

    #[test]
    fn draft04_boolean_exclusive_bounds_are_read_as_draft04() {
        let declared = json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
            "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 10, "exclusiveMaximum": true}}});
        assert!(valid(&declared, &json!({"n": 5})));
        assert!(!valid(&declared, &json!({"n": 0})));
        assert!(!valid(&declared, &json!({"n": 10})));
        let undeclared = json!({"type": "object",
            "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": true}}});
        assert_eq!(dialect(&undeclared), SchemaDialect { dialect: Dialect::Draft04, declared: false });
        assert!(valid(&undeclared, &json!({"n": 0.5})));
        assert!(!valid(&undeclared, &json!({"n": 0})), "exclusiveMinimum: true excludes the minimum");
        // A 2020-12 schema with numeric bounds stays 2020-12.
        let modern = json!({"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 0}}});
        assert_eq!(dialect(&modern), SchemaDialect { dialect: Dialect::Draft202012, declared: false });
        assert!(!valid(&modern, &json!({"n": 0})));
    }

    #[test]
    fn draft04_id_is_the_base_of_its_refs() {
        let s = json!({"id": "http://example.com/tool.json", "type": "object",
            "definitions": {"pos": {"id": "#pos", "type": "integer", "minimum": 1}},
            "properties": {"page": {"$ref": "#pos"}}});
        assert_eq!(dialect(&s), SchemaDialect { dialect: Dialect::Draft04, declared: false });
        assert!(valid(&s, &json!({"page": 2})));
        assert!(!valid(&s, &json!({"page": 0})));
        // A property called `id` is not a draft-04 marker.
        let p = json!({"type": "object", "properties": {"id": {"type": "string"}}, "default": {"id": "x"}});
        assert_eq!(dialect(&p), SchemaDialect { dialect: Dialect::Draft202012, declared: false });
    }

    #[test]
    fn undeclared_draft07_tuples_fall_back() {
        let s = json!({"type": "object", "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}}});
        let d = dialect(&s);
        assert!(!d.declared);
        assert!(valid(&s, &json!({"pair": ["a", 1]})));
        assert!(!valid(&s, &json!({"pair": ["a", "b"]})));
    }

    #[test]
    fn unusable_schemas_name_the_problem() {
        let bad_type = compile(&json!({"type": "object", "properties": {"a": {"type": "strnig"}}}));
        let e = bad_type.err().map(|e| e.0).unwrap_or_default();
        assert!(e.contains("strnig") && e.contains("2020-12") && e.contains("/properties/a/type"), "{e}");
        let unknown = compile(&json!({"$schema": "https://example.com/my-meta", "type": "object"}));
        assert!(unknown.err().is_some_and(|e| e.0.contains("example.com/my-meta")));
        let declared = compile(&json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"n": {"exclusiveMinimum": true}}}));
        assert!(declared.err().is_some_and(|e| e.0.contains("declares draft-07")));
        let not_a_string = compile(&json!({"$schema": 7, "type": "object"}));
        assert!(not_a_string.is_err());
    }
}
