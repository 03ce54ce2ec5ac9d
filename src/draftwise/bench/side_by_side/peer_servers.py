"""The servers of a side-by-side run, as given on the command line: one at a URL (`--server NAME=URL`)
or one the run starts (`--peer [NAME=]KIND[:ARGS]`): `draftwise serve` or llama.cpp's llama-server
(built by scripts/build_llama_server.sh) with one of its speculation methods, both on the same GGUF,
threads and context size (`PeerSetup`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise.bench.serving.serve_process import ServeProcess, ServerProcess, free_port
from draftwise.types import ConfigError

KINDS = ("draftwise", "llama-server")
# llama-server's --spec-type values in the llama.cpp that llama-cpp-python 0.3.36 vendors; plain: none.
LLAMA_SERVER_METHODS = (
    "plain",
    "draft-simple",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)


@dataclass(frozen=True)
class ServerSpec:
    """A server of the comparison: at url, or started as kind with args (draftwise: serve's options;
    llama-server: the speculation method, then any further options of llama-server's own)."""

    name: str
    url: str | None = None
    kind: str | None = None
    args: tuple[str, ...] = ()

    @classmethod
    def at_url(cls, spec: str) -> ServerSpec:
        """--server NAME=URL. Example: at_url("llama=http://127.0.0.1:8080") -> ServerSpec("llama", url=...)."""
        name, sep, url = spec.partition("=")
        if not sep or not name.strip() or not url.strip().startswith(("http://", "https://")):
            raise ConfigError(f"a server is NAME=URL with an http(s) URL, got {spec!r}")
        return cls(name.strip(), url=url.strip())

    @classmethod
    def peer(cls, spec: str) -> ServerSpec:
        """--peer [NAME=]KIND[:ARGS]; the name defaults to KIND[:METHOD] for llama-server, KIND for draftwise.

        Examples: peer("llama-server:ngram-simple") -> ServerSpec("llama-server:ngram-simple", kind="llama-server",
        args=("ngram-simple",)); peer("nodraft=draftwise:--draft none") -> ServerSpec("nodraft", kind="draftwise",
        args=("--draft", "none")).
        """
        name, sep, rest = spec.partition("=")
        if not sep or " " in name or ":" in name:  # no NAME=: the whole spec is KIND[:ARGS]
            name, rest = "", spec
        kind, _, args_text = rest.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ConfigError(f"a peer is [NAME=]KIND[:ARGS] with KIND one of {', '.join(KINDS)}, got {spec!r}")
        args = tuple(shlex.split(args_text))
        if kind == "llama-server":
            method = args[0] if args and not args[0].startswith("-") else "plain"
            if method not in LLAMA_SERVER_METHODS:
                raise ConfigError(
                    f"peer {spec!r}: llama-server's method is one of {', '.join(LLAMA_SERVER_METHODS)}, got {method!r}"
                )
            args = (method, *(args[1:] if args and args[0] == method else args))
            default_name = "llama-server" if method == "plain" else f"llama-server:{method}"
        else:
            default_name = "draftwise"
        return cls(name.strip() or default_name, kind=kind, args=args)


@dataclass(frozen=True)
class PeerSetup:
    """What every started server shares: the target GGUF, the threads and the context size; the draft
    model (llama-server's draft-simple) and llama-server's binary where a peer needs them. serve_args: the
    same for draftwise serve as the command line gave them (none given: serve's defaults, which are these)."""

    target: str
    threads: int
    n_ctx: int
    draft_model: str | None = None
    llama_server: str | None = None
    serve_args: tuple[str, ...] = ()


def llama_server_command(spec: ServerSpec, setup: PeerSetup, port: int) -> list[str]:
    """llama-server on the target with the spec's method, the setup's threads and context, one slot.

    NOTE: in this llama.cpp, -md alone does not speculate: --spec-type selects the method.
    """
    if not setup.llama_server or not Path(setup.llama_server).is_file():
        raise ConfigError(
            f"peer {spec.name}: no llama-server binary at {setup.llama_server}; build it with "
            "scripts/build_llama_server.sh or give its path with --llama-server"
        )
    method, *extra = spec.args
    command = [setup.llama_server, "-m", setup.target, "-t", str(setup.threads), "-tb", str(setup.threads)]
    command += ["-c", str(setup.n_ctx), "-np", "1", "--host", "127.0.0.1", "--port", str(port)]
    if method != "plain":
        command += ["--spec-type", method]
    if method == "draft-simple":
        if not setup.draft_model:
            raise ConfigError(f"peer {spec.name}: draft-simple needs a draft model (--draft-model)")
        command += ["-md", setup.draft_model, "-td", str(setup.threads)]
    return command + list(extra)


def start(spec: ServerSpec, setup: PeerSetup, startup_timeout_s: float) -> ServerProcess:
    """The server process of a --peer (not yet started: enter it)."""
    if spec.kind == "draftwise":
        # The shared options first: the peer's own ARGS come after and win (click keeps an option's last value).
        server = ServeProcess([*setup.serve_args, *spec.args], startup_timeout_s=startup_timeout_s)
        server.name = f"{spec.name} (draftwise serve)"
        return server
    port = free_port()
    command = llama_server_command(spec, setup, port)
    return ServerProcess(command, f"http://127.0.0.1:{port}", f"{spec.name} (llama-server)", startup_timeout_s)


def shown_command(command: Sequence[str]) -> str:
    """A started server's command line for a results file; draftwise's as `draftwise serve ...`."""
    if len(command) > 3 and command[1:4] == ["-m", "draftwise.cli", "serve"]:
        return shlex.join(["draftwise", *command[3:]])
    return shlex.join(command)
