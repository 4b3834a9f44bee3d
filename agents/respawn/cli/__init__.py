"""`respawn`: the command line over Respawn's REST API (/api/v1/).

It talks HTTP only (requests) and never imports Django, so it installs and runs
anywhere a user has Python."""
