"""The CLI sends a token, or a password at login, over plain http:// only to loopback,
unless told it may (`--insecure-http`, RESPAWN_INSECURE_HTTP=1): anywhere else anyone on
the way reads them (issue 35). The control plane's name resolves here, through a
stand-in resolver (the network's edge), to a listener on 127.0.0.1 that records what
reaches it, so nothing leaves loopback whichever way the CLI decides."""

from __future__ import annotations

import io
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from respawn.cli.__main__ import main

TOKEN = "rsp_plain_http_test_token"


class Listener:
    """An HTTP server on 127.0.0.1 answering every request with an empty page of results."""

    def __init__(self):
        self.heard: list[dict] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                listener.heard.append(dict(self.headers.items()))
                body = json.dumps({"count": 0, "next": None, "previous": None, "results": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def listener(monkeypatch, tmp_path):
    """`respawn.test` (a control plane somewhere on the network) resolves to the listener."""
    running = Listener()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        return real("127.0.0.1" if host == "respawn.test" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    for name in ("RESPAWN_URL", "RESPAWN_INSECURE_HTTP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RESPAWN_TOKEN", TOKEN)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    yield running
    running.server.shutdown()
    running.server.server_close()


def respawn(*args, stdin: str = "") -> tuple[int, str]:
    """The CLI's exit code and what it said on stderr."""
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stderr", err)
        patch.setattr("sys.stdin", io.StringIO(stdin))
        code = main(list(args))
    return code, err.getvalue()


def test_a_token_is_never_sent_over_plain_http_off_loopback(listener, monkeypatch):
    url = f"http://respawn.test:{listener.port}"
    code, said = respawn("ls", "--url", url)
    assert code == 2 and "plain http://" in said and "--insecure-http" in said, said
    monkeypatch.setenv("RESPAWN_URL", url)
    assert respawn("ls")[0] == 2
    code, said = respawn("login", "--url", url, "--username", "alice", "--password-stdin", stdin="secret\n")
    assert code == 2 and "plain http://" in said, said
    assert listener.heard == []


def test_plain_http_goes_to_loopback_and_where_the_user_says_it_may(listener, monkeypatch):
    for url in (f"http://127.0.0.1:{listener.port}", f"http://localhost:{listener.port}"):
        assert respawn("ls", "--url", url) == (0, "")
    assert respawn("ls", "--url", f"http://respawn.test:{listener.port}", "--insecure-http") == (0, "")
    monkeypatch.setenv("RESPAWN_INSECURE_HTTP", "1")
    assert respawn("ls", "--url", f"http://respawn.test:{listener.port}") == (0, "")
    assert [h["Authorization"] for h in listener.heard] == [f"Bearer {TOKEN}"] * 4
