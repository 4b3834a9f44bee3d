"""The HTTP API: the people's REST API (/api/v1/), the agents' (/api/agent/v1/), the
OpenAPI schema and Prometheus /metrics. Thin views over the core and the subsystems,
which import nothing from here."""
