"""The HTTP API under /api/ (DESIGN.md §7, §12, §13), served by django-ninja: `site` the API
itself (routers, parser, error answers, the OpenAPI document, URL patterns); `core` what every
endpoint shares (token auth, command receipts, errors); `schemas` the request and answer
shapes; `views` the tasks, plans, answers and journal; `agent` the lease an outside agent holds
(`next`, `commit`, `effects`); `talk` the conversation and schedules."""
