"""`tputrace tensorboard`'s server shows its own logdir only, and only to requests for its own address:
xprof's `session_path` / `run_path` (which read any profile folder on the machine), run names out of
the logdir and foreign `Host` headers (DNS rebinding) get 403, against the real server on 127.0.0.1."""

from __future__ import annotations

import gzip
import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tputrace.cli.main import main

pytest.importorskip("xprof.server", reason="needs xprof (pip install -e .[views])")


@pytest.fixture(scope="module")
def served(sample_trace_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The server on the sample trace's logdir, and another profile folder beside it that it must not show."""
    from tputrace.cli.tensorboard import XProfServer

    logdir = tmp_path_factory.mktemp("served")
    assert main(["export", str(sample_trace_path), "--tensorboard", str(logdir), "--run", "sample"]) == 0
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    assert main(["export", str(sample_trace_path), "--tensorboard", str(elsewhere), "--run", "private"]) == 0
    server = XProfServer(logdir, 0)
    server.start_in_thread()
    try:
        yield server.port, elsewhere
    finally:
        server.stop()


def _get(port: int, path: str, host: str | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
        connection.putheader("Host", host if host is not None else f"127.0.0.1:{port}")
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        return response.status, gzip.decompress(body) if response.getheader("Content-Encoding") == "gzip" else body
    finally:
        connection.close()


RUNS = "/data/plugin/profile/runs"


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST:{port}"])
def test_own_address_is_served(served: tuple[int, Path], host: str) -> None:
    port, _ = served
    status, body = _get(port, RUNS, host.format(port=port))
    assert status == 200 and json.loads(body) == ["sample"]


@pytest.mark.parametrize("host", ["evil.example:{port}", "evil.example", "127.0.0.1.evil.example:{port}", "127.0.0.1:1", ""])
def test_other_hosts_are_refused(served: tuple[int, Path], host: str) -> None:
    port, _ = served
    status, body = _get(port, RUNS, host.format(port=port))
    assert status == 403 and b"only" in body


def test_session_path_to_another_profile_folder_is_refused(served: tuple[int, Path]) -> None:
    port, elsewhere = served
    session = next((elsewhere / "plugins" / "profile").iterdir())
    status, body = _get(port, f"{RUNS}?session_path={session}")
    assert status == 403 and b"session_path" in body and b"private" not in body


@pytest.mark.parametrize("run_path", ["/", "{elsewhere}"])
def test_run_path_is_refused(served: tuple[int, Path], run_path: str) -> None:
    port, elsewhere = served
    status, body = _get(port, f"{RUNS}?run_path={run_path.format(elsewhere=elsewhere)}")
    assert status == 403 and b"run_path" in body


@pytest.mark.parametrize("run", ["../../elsewhere", "/etc", "sample/../../x"])
def test_run_names_out_of_the_logdir_are_refused(served: tuple[int, Path], run: str) -> None:
    port, _ = served
    status, _ = _get(port, f"/data/plugin/profile/run_tools?run={run}")
    assert status == 403


def test_the_served_run_still_has_its_tools(served: tuple[int, Path]) -> None:
    port, _ = served
    status, body = _get(port, "/data/plugin/profile/run_tools?run=sample")
    assert status == 200 and "overview_page" in {tool.rstrip("@") for tool in json.loads(body)}
