#!/usr/bin/env python3
"""An MCP server built with the official Python SDK (`mcp` 2.x, MCPServer) offering many
tools with realistic, distinct definitions, so exposure ranking runs on real MCP tool
definitions. Usage: many_tools.py [COUNT] [LABEL]. COUNT defaults to 300; every tool is
`<domain>_<action>_<n>` with a description naming its domain and action. With LABEL, a
`search` tool is added whose answers name the label (two such servers offer the same
tool name)."""
import sys

from mcp.server.mcpserver import MCPServer

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 300
LABEL = sys.argv[2] if len(sys.argv) > 2 else None
DOMAINS = ["invoice", "calendar", "weather", "ticket", "customer", "shipment", "payroll", "inventory",
           "contract", "recipe", "flight", "hotel", "playlist", "repository", "sensor"]
ACTIONS = [("create", "Create a new"), ("delete", "Delete an existing"), ("list", "List every"),
           ("update", "Update the fields of a"), ("archive", "Archive an old")]

server = MCPServer(LABEL or "many-tools")


def make(domain, action, n):
    def tool(identifier: str, note: str = "") -> str:
        return f"{action} {domain} {identifier} ({n}) {note}".strip()
    return tool


for i in range(COUNT):
    domain = DOMAINS[i % len(DOMAINS)]
    action, verb = ACTIONS[(i // len(DOMAINS)) % len(ACTIONS)]
    n = i // (len(DOMAINS) * len(ACTIONS))
    server.add_tool(make(domain, action, n), name=f"{domain}_{action}_{n}",
                    description=f"{verb} {domain} record in the {domain} system (variant {n})")

if LABEL:
    def search(query: str) -> str:
        return f"{LABEL} results for {query}"
    server.add_tool(search, name="search", description=f"Search the {LABEL} index")

server.run("stdio")
