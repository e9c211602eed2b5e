"""Who may drive the rollout server: its shared secret, and the guard in front of its HTTP API.

The secret reaches a process by a file (mode 0600, `--secret-file` / rollout.server_secret_file) or by the
environment (SECRET_ENV), never by a command-line value, which `ps` shows to every user. A trainer that starts
its own server makes one per run and hands it to the child in SECRET_ENV. Every request but GET /health carries
it as `Authorization: Bearer SECRET`; the guard compares it in constant time and answers 401 without reading the
body; a path or method the API has not, a body that is not JSON or over the server's limit, are refused before
the body is read too (404, 405, 415, 413). docs/rollout_server.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import sys

from ...contract.errors import NO_VALUE, UserError

SECRET_ENV = "GRPO_STUDIO_ROLLOUT_SECRET"
MIN_CHARS, MAX_CHARS = 16, 4096  # a guessable secret is none; an HTTP header line has to hold it
OPEN = ("/health",)  # the liveness probe: says only that the server is up and its policy version


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def _checked(secret: str, source: str, key: str, value) -> str:
    """The secret without its line end, if it can be one: visible ASCII (it travels in a header), long enough."""
    secret = secret.strip()
    why = None
    if not secret:
        why = f"{source} is empty"
    elif len(secret) > MAX_CHARS:
        why = f"{source} holds {len(secret)} characters; at most {MAX_CHARS}"
    elif not all("!" <= c <= "~" for c in secret):
        why = f"{source} holds a character that is not visible ASCII (it travels in an HTTP header)"
    elif len(secret) < MIN_CHARS:
        why = f"{source} holds {len(secret)} characters; at least {MIN_CHARS}"
    if why:
        raise UserError(f"{why}; make one with: (umask 077; openssl rand -hex 32 > FILE)", key=key, value=value)
    return secret


def read_secret(path: str, key: str) -> str | None:
    """The secret of a file named by `key` (a flag or config key), else of SECRET_ENV, else None. Both at once
    is refused (which one is meant?). A file must be a regular file that only its owner can read."""
    env = os.environ.get(SECRET_ENV)
    if not path:
        return None if env is None else _checked(env, f"the environment variable {SECRET_ENV}", SECRET_ENV, NO_VALUE)
    if env is not None:
        raise UserError(f"give the secret once: {SECRET_ENV} is set too; unset one of them", key=key, value=path)
    path = os.path.expanduser(path)  # `--set rollout.server_secret_file=~/x`: no shell expands that ~
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without a writer, and is refused below
    except OSError as err:
        raise UserError(f"cannot read it: {err.strerror or err}", key=key, value=path) from None
    try:
        info = os.fstat(fd)  # of what was opened: no swap between the check and the read
        if not stat.S_ISREG(info.st_mode):
            raise UserError("not a regular file; a secret file is a plain file of mode 0600", key=key, value=path)
        if info.st_mode & 0o077:
            raise UserError(
                f"other users can read it (mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 {path}",
                key=key,
                value=path,
            )
        if info.st_size > MAX_CHARS + 2:
            raise UserError(f"{info.st_size} bytes; a secret is at most {MAX_CHARS} characters", key=key, value=path)
        text = os.read(fd, MAX_CHARS + 2).decode("ascii", errors="replace")
    except OSError as err:
        raise UserError(f"cannot read it: {err.strerror or err}", key=key, value=path) from None
    finally:
        os.close(fd)
    return _checked(text, "the file", key, path)


def header(secret: str | None) -> dict:
    """The request header that carries `secret` (none without one)."""
    return {} if secret is None else {"Authorization": f"Bearer {secret}"}


def _digest(text: bytes) -> bytes:
    return hashlib.sha256(text).digest()


async def _answer(send, status: int, error: str, extra: list | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware around the API: the secret (every path but OPEN, when the server has one), the route, the
    content type and the body limit, each refused before any byte of the body is read; then one line for anything
    the API raised (never a traceback in the server's log). Only a request that may reach an endpoint taking a
    body (authenticated, when the server has a secret) has its body read, up to the limit."""

    def __init__(self, app, secret: str | None, max_body: int):
        self.app, self.max_body = app, max_body
        self.digest = None if secret is None else _digest(secret.encode())
        self.routes = {route.path: route.methods for route in app.routes}  # path → {"GET", "HEAD"} / {"POST"}

    def _authorised(self, scope) -> bool:
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given) != 1:
            return False
        scheme, _, token = given[0].strip().partition(b" ")
        # the scheme is case-insensitive (RFC 7235); compare digests: compare_digest's time then depends on
        # neither the secret's content nor its length
        ok = hmac.compare_digest(_digest(token.strip()), self.digest)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if self.digest is not None and path not in OPEN and not self._authorised(scope):
            return await _answer(
                send,
                401,
                "no valid secret: send the header 'Authorization: Bearer <secret>' (docs/rollout_server.md)",
                [(b"www-authenticate", b"Bearer")],
            )
        methods = self.routes.get(path)
        if methods is None:
            return await _answer(send, 404, f"{method} {path}: no such endpoint")
        if method not in methods:
            allowed = ", ".join(sorted(methods))
            return await _answer(send, 405, f"{method} {path}: allowed: {allowed}", [(b"allow", allowed.encode())])
        if "POST" not in methods:  # /health, /version: no body is read, whatever the request announced
            return await self._call(scope, receive, send)
        lengths = [v for k, v in scope["headers"] if k == b"content-length"]
        if any(not v.isdigit() or int(v) > self.max_body for v in lengths):
            return await _answer(send, 413, f"the body is over this server's limit of {self.max_body} bytes")
        kind = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"application/json":
            shown = kind.decode("latin-1")[:100] or "none"
            return await _answer(
                send, 415, f"the body must be JSON, sent with the header 'Content-Type: application/json' (got {shown})"
            )
        parts, size, more = [], 0, True
        while more:  # whole before the API sees it, so a chunked body is held to the limit too
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            parts.append(message.get("body", b""))
            size, more = size + len(parts[-1]), message.get("more_body", False)
            if size > self.max_body:
                return await _answer(send, 413, f"the body is over this server's limit of {self.max_body} bytes")
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(parts), "more_body": False}

        await self._call(scope, replay, send)

    async def _call(self, scope, receive, send):
        try:
            await self.app(scope, receive, send)
        except Exception as err:  # noqa: BLE001 - the API has answered 500 with this line already
            print(f"rollout server: {scope['path']}: {one_line(err)}", file=sys.stderr, flush=True)


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message (torch's C++ errors carry a stack)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__
