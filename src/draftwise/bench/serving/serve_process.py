"""Servers run for a benchmark: any server command (ServerProcess), `draftwise serve` on a free
loopback port (ServeProcess), and the command lines a results file keeps (redact_api_keys)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import httpx

from draftwise.bench.serving.load import LoadError


def redact_api_keys(args: Sequence[str]) -> list[str]:
    """A command line fit for a results file, at any depth of quoting.

    Example: ["--api-key", "sk-1", "--serve-args", "--api-key=sk-2 --k 8"] ->
    ["--api-key", "REDACTED", "--serve-args", "--api-key=REDACTED --k 8"].
    """
    out = []
    for i, arg in enumerate(args):
        if " " in arg and "--api-key" in arg:  # a pass-through option string such as --serve-args
            arg = shlex.join(redact_api_keys(shlex.split(arg)))
        elif i > 0 and args[i - 1] == "--api-key":
            arg = "REDACTED"
        elif arg.startswith("--api-key="):
            arg = "--api-key=REDACTED"
        out.append(arg)
    return out


def free_port() -> int:
    """A loopback port free now (another process could take it before it is bound; rare enough here)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server COMMAND listening on `url` for a with block, ready once its /health answers 200; `name`
    says which in errors. Its output goes to a file, which `log_tail` reads.

    Example: with ServerProcess(["llama-server", "-m", "m.gguf", "--port", "8090"], "http://127.0.0.1:8090",
    "llama-server") as server: ...
    """

    def __init__(self, command: Sequence[str], url: str, name: str, startup_timeout_s: float = 600.0) -> None:
        self.command = list(command)
        self.url = url
        self.name = name
        self.startup_timeout_s = startup_timeout_s

    def __enter__(self) -> ServerProcess:
        # NOTE: output goes to a file, not a pipe: nothing reads a pipe during the run, and a full one blocks
        # the server.
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            self.command,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while self.proc.poll() is None:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise LoadError(
                    f"{self.name} did not answer /health within {self.startup_timeout_s:g} s; "
                    f"its output ends:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        raise LoadError(
            f"{self.name} exited with status {self.proc.returncode} before answering; "
            f"its output ends:\n{self.log_tail()}"
        )

    def log_tail(self, num_lines: int = 20) -> str:
        self.log.seek(0)
        return "\n".join(self.log.read().strip().splitlines()[-num_lines:])

    def __exit__(self, *exc_info) -> None:
        self.proc.terminate()  # uvicorn and llama-server shut down gracefully on SIGTERM
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class ServeProcess(ServerProcess):
    """`draftwise serve SERVE_ARGS` on a free loopback port for a with block; `url` is its base URL.

    Example: with ServeProcess(["--draft", "ngram"]) as server: run_bench(server.url, prompts, [1, 2]).
    """

    def __init__(self, serve_args: Sequence[str], startup_timeout_s: float = 600.0) -> None:
        port = free_port()
        # NOTE: --host/--port go last: click keeps an option's last value, so serve_args cannot move the server.
        command = [
            sys.executable,
            "-m",
            "draftwise.cli",
            "serve",
            *serve_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        super().__init__(command, f"http://127.0.0.1:{port}", "draftwise serve", startup_timeout_s)
