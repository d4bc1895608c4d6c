"""The HTTP API under /api/ (DESIGN.md §7, §12, §13): token auth for agents, command
receipts, and an OpenAPI document. `core` is what every endpoint shares; `views` the tasks,
plans, answers and journal; `agent` the lease an outside agent holds (`next`, `commit`,
`effects`); `openapi` the document."""
