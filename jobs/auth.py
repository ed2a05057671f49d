"""Ray's token authentication as a client sees it: where the token is, and the header.

Recent Ray (2.58 and 2.60 measured) can put a cluster (its GCS and its dashboard/job server)
behind a shared token (`RAY_AUTH_MODE=token` on the nodes; Ray 2.59+ turns it on by default
for a local ray.init()).
Ray's job SDK adds the token only when `RAY_AUTH_MODE=token` is set in the client's own
environment, so a laptop holding just the token would be refused; linpipe finds the token
where Ray does and sends it itself. The token is only ever put in a request header: never
printed, logged, or written to a store, a spec, a runtime_env or a job's metadata.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from linpipe.errors import LinpipeError

TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
MODE_ENV = "RAY_AUTH_MODE"

# Where Ray looks, in its order, in words for error messages.
WHERE = (f"${TOKEN_ENV}, the file named by ${TOKEN_PATH_ENV}, or ~/.ray/auth_token; "
         "`ray get-auth-token` on the head prints the cluster's token")


@dataclass(frozen=True)
class Token:
    """A token and where it came from; repr and str never show the token itself."""

    value: str
    source: str  # "$RAY_AUTH_TOKEN", "$RAY_AUTH_TOKEN_PATH (PATH)" or "~/.ray/auth_token (PATH)"

    def __repr__(self) -> str:
        return f"Token(from {self.source})"

    __str__ = __repr__


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def _read(path: Path, what: str) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LinpipeError(f"{what} {path}: cannot read the Ray token ({e.strerror or e})") from None


def find_token() -> Token | None:
    """The token Ray itself would use: $RAY_AUTH_TOKEN, else the file $RAY_AUTH_TOKEN_PATH
    names, else ~/.ray/auth_token; None when there is none."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    if value:
        return Token(value, f"${TOKEN_ENV}")
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        value = _read(path, f"${TOKEN_PATH_ENV}:")
        if value is None:  # a named file that is missing: an error, not a silent fallback
            raise LinpipeError(f"${TOKEN_PATH_ENV} names {path}, which does not exist or is empty")
        return Token(value, f"${TOKEN_PATH_ENV} ({path})")
    path = default_token_path()
    value = _read(path, "")
    return Token(value, f"~/.ray/auth_token ({path})") if value else None


def auth_headers(token: Token | None) -> dict[str, str]:
    """The HTTP header the dashboard/job server checks (empty without a token)."""
    return {"Authorization": f"Bearer {token.value}"} if token else {}


def missing_token_message(url: str) -> str:
    return (f"the Ray job server at {url} requires a token (HTTP 401) and none was found: "
            f"put the cluster's token in {WHERE}")


def wrong_token_message(url: str, token: Token | None) -> str:
    src = token.source if token else "the request"
    return (f"the Ray job server at {url} refused the token from {src} (HTTP 403: wrong "
            f"token): use the cluster's token, in {WHERE}")


def gcs_requires_token(address: str, timeout: float = 5.0) -> bool | None:
    """Whether the GCS at HOST:PORT refuses calls without a token: True, False, or None when
    its answer says neither (an older Ray without the probed call, a timeout). One unary gRPC
    call with an empty message to the GCS's liveness service: a token-authenticated GCS
    answers UNAUTHENTICATED before it looks at the call, an open one answers it."""
    answer = _check_alive(address, None, timeout)
    return None if answer is None else answer == "unauthenticated"


def _check_alive(address: str, token: Token | None, timeout: float) -> str | None:
    """One CheckAlive call to the GCS (with the token, as Ray sends it, if given): "ok",
    "unauthenticated", or None when the answer says neither (no grpc, an older Ray, a timeout)."""
    try:
        import grpc  # Ray's own dependency
    except ImportError:
        return None
    target = address.split("://", 1)[-1].rstrip("/")
    metadata = [(k.lower(), v) for k, v in auth_headers(token).items()] or None
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/CheckAlive")
        try:
            call(b"", timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            return "unauthenticated" if e.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return "ok"


def gcs_token_problem(address: str, timeout: float = 5.0) -> str | None:
    """Why the GCS at HOST:PORT would refuse this driver, in words, said before Ray tries to join
    it (ray.init retries for about 20 s behind a warning a second, then says nothing of a token):
    it asks for a token and none is found where Ray looks, or it refuses the one found. None when
    it would let the driver in, or cannot tell."""
    if gcs_requires_token(address, timeout) is not True:
        return None
    token = find_token()
    if token is None:
        return f"the Ray cluster requires a token and none was found: put the cluster's token in {WHERE}"
    if _check_alive(address, token, timeout) == "unauthenticated":
        return (f"the Ray cluster refused the token from {token.source} (wrong token): use the cluster's "
                f"token, in {WHERE}")
    return None


def enable_token_mode_for_join(address: str | None) -> Token | None:
    """Before `import ray` joins a cluster at an explicit HOST:PORT: when a token is found,
    RAY_AUTH_MODE is unset and the cluster asks for a token (or cannot tell), turn token mode
    on for this process, as Ray does itself only for address "auto". A cluster that answers
    without a token is joined without token mode: Ray 2.59+ writes ~/.ray/auth_token for any
    local ray.init(), so a token at hand says nothing about the cluster, and a driver in token
    mode on an open cluster (Ray 2.60, measured) has every actor it creates cancelled. Ray
    reads the mode once, when it is imported: a process that imported ray before this sees no
    effect (the join error then says to set it)."""
    if not address or address in ("auto", "local") or os.environ.get(MODE_ENV):
        return None
    token = find_token()
    if token is None or gcs_requires_token(address) is False:
        return None
    os.environ[MODE_ENV] = "token"
    return token
