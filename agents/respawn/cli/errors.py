"""Failures the CLI reports, each with the exit code a script can test."""

EXIT_OK = 0
EXIT_FAILED = 1  # the server or the network said no (conflict, forbidden, server error, unreachable)
EXIT_BAD_INPUT = 2  # wrong arguments, an invalid job file, or fields the server rejected
EXIT_AUTH = 3  # not logged in, or the token is wrong, expired or revoked
EXIT_NOT_FOUND = 4  # no such object (or not in your teams)


class CliError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_FAILED, details: list[str] | None = None):
        super().__init__(message)
        self.message, self.exit_code, self.details = message, exit_code, details or []
