-- External MCP, issue 14: each discovered tool's input schema dialect (or why its schema is
-- unusable), and a definition under review.
--
-- schema_dialect: the JSON Schema dialect its inputSchema compiled as (draft-04, draft-06,
-- draft-07, 2019-09, 2020-12), schema_declared 1 when the schema named it in $schema;
-- schema_problem: why it compiles in no dialect (the tool is then unavailable with
-- schema_unusable; the rest of the listing is unaffected).
--
-- review_previous: when a re-discovered definition (name, title, description, inputSchema,
-- outputSchema, annotations) differs from the one that had agent access, the earlier
-- definition as JSON; agent access stays off (definition_changed) until the owner turns it on
-- again, accepting the new one; review_since: when the change was seen.
ALTER TABLE mcp_tools ADD COLUMN schema_dialect TEXT;
ALTER TABLE mcp_tools ADD COLUMN schema_declared INTEGER;
ALTER TABLE mcp_tools ADD COLUMN schema_problem TEXT;
ALTER TABLE mcp_tools ADD COLUMN review_previous TEXT;
ALTER TABLE mcp_tools ADD COLUMN review_since TEXT;
