"""Test fixtures: the real ``sundial`` binary, started on a free loopback port with its own data
directory. ``SUNDIAL_BIN`` names the binary, else ``target/release/sundial`` of this repository."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "clients" / "python" / "src"))

from sundial_client import Client  # noqa: E402


def binary() -> Path:
    path = Path(os.environ.get("SUNDIAL_BIN") or REPO / "target" / "release" / "sundial")
    # A relative SUNDIAL_BIN is taken from the current directory, else from the repository root.
    if not path.is_absolute():
        path = path.resolve() if path.exists() else REPO / path
    if not path.exists():
        pytest.fail(
            f"no sundial binary at {path}: build it (cargo build --release -p sundial-cli) "
            "or point SUNDIAL_BIN at one (for example target/debug/sundial)",
            pytrace=False,
        )
    return path


class Server:
    """One ``sundial server`` process; :meth:`restart` keeps its data directory and port."""

    def __init__(self, data_dir: Path, extra_args: Optional[List[str]] = None) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self.url = ""
        self.log: List[str] = []

    def start(self) -> "Server":
        args = [
            str(binary()),
            "server",
            "--data-dir",
            str(self.data_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--shutdown-grace",
            "1s",
            *self.extra_args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SUNDIAL_")}
        env.setdefault("RUST_LOG", "warn")
        deadline = time.monotonic() + 20
        while True:
            self.proc = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
            )
            line = self._read_address(deadline)
            if line:
                break
            # The port of a restart may still be held for a moment: try again.
            self.proc.wait()
            if time.monotonic() > deadline:
                raise RuntimeError("sundial server did not start:\n" + "".join(self.log[-30:]))
            time.sleep(0.2)
        self.url = line.strip().split(" ")[-1]
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _read_address(self, deadline: float) -> Optional[str]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            if line.startswith("sundial listening on "):
                return line
            if time.monotonic() > deadline:
                break
        return None

    def _drain(self) -> None:
        proc = self.proc
        if proc is None or proc.stdout is None:
            return
        for line in proc.stdout:
            self.log.append(line)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.stop(sig)
        self.start()

    def client(self, **kw) -> Client:
        return Client(self.url, **kw)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("sundial-shared")).start()
    yield server
    server.stop()


@pytest.fixture
def server(tmp_path):
    """A server of the test's own (for tests that restart it or need an empty store)."""
    s = Server(tmp_path / "data").start()
    yield s
    s.stop()


@pytest.fixture
def client(shared_server):
    with shared_server.client() as c:
        yield c


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses (tests share one server)."""
    return f"q-{uuid.uuid4().hex[:12]}"


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {predicate}")
        time.sleep(interval)
