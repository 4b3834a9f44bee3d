"""People and their credentials: bearer-token authentication (personal and agent
tokens), token secrets, the one permission table, and team administration
(members, roles, limits, tokens; each change audited).

Imports the core; agent-token authentication shares the fleet's heartbeat lookup."""
