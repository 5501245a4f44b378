"""The API client's refusals say what the caller can do about them, for every command that calls the service:
a URL without the service's prefix (the proxy's redirect to the hub, the service's own 404 at its root) names
the prefix, and a call only admins make says how to get an admin's token.

The service as ``assemble`` builds it on the demo pool, reached over ASGI at whatever URL the command was given.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_telemetry_api import USERS, Client, Service
from token_hub import token_hub

from gpupool.spawner.cli import main
from gpupool.spawner.client import GpupoolError
from gpupool.spawner.client.connection import Connection
from gpupool.spawner.client.errors import raise_for_problem
from gpupool.spawner.names import SERVICE_FILE

PREFIX_HINT = (
    "the gpupool service? Its URL ends in /services/gpupool/, e.g. http://127.0.0.1:8000/services/gpupool/"
)
ADMIN_HINT = (
    "pass an admin's JupyterHub API token as --token or in JUPYTERHUB_API_TOKEN (token=… in Python): an admin "
    "makes one on the hub's token page, /hub/token"
)
COMMANDS = (["mig", "advise"], ["drain", "dgx-h100-01/0"], ["pool"])


@pytest.fixture(scope="module")
def hub_api() -> Iterator[str]:
    with token_hub(USERS) as url:
        yield url


@pytest.fixture
def service(tmp_path: Path, hub_api: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """Every blocking call of a :class:`Connection` goes to the service over ASGI, at the URL it was made for."""
    with Client(Service(tmp_path, hub_api).app) as client:

        def send(self: Connection, method: str, path: str, **kwargs: Any) -> httpx.Response:
            request = client.http.request(method, self._url(path), headers=self._headers, **kwargs)
            return client.runner.run(request)

        monkeypatch.setattr(Connection, "_send", send)
        monkeypatch.delenv("GPUPOOL_SERVICE_URL", raising=False)
        monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
        yield client


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What a command the service refused says, whichever way it exits (always status 1)."""
    try:
        code: object = main(argv)
    except SystemExit as exit_:
        code = 1 if isinstance(exit_.code, str) else exit_.code
        said = str(exit_.code) if isinstance(exit_.code, str) else ""
    else:
        said = ""
    said += capsys.readouterr().err
    assert code == 1 and said.count("\n") <= 1, said
    return said.strip()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_the_services_root_without_its_prefix_is_named_with_the_prefix_it_needs(
    command: list[str], service: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    said = _refusal([*command, "--url", "http://127.0.0.1:10101", "--token", "admin-token"], capsys)
    assert said.startswith("gpupool: Not Found; is http://127.0.0.1:10101/ " + PREFIX_HINT), said


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_the_proxys_redirect_to_the_hub_is_named_with_the_prefix_it_needs(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def send(self: Connection, method: str, path: str, **kwargs: Any) -> httpx.Response:
        location = {
            "Location": f"/hub/api/v1/{path}"
        }  # what JupyterHub's proxy answers a path it does not route
        return httpx.Response(302, headers=location, request=httpx.Request(method, self._url(path)))

    monkeypatch.setattr(Connection, "_send", send)
    said = _refusal([*command, "--url", "http://127.0.0.1:8000", "--token", "admin-token"], capsys)
    url = "http://127.0.0.1:8000/api/v1/"
    assert said.startswith(f"gpupool: 302 Found from {url}"), said
    assert said.endswith(f"; is http://127.0.0.1:8000/ {PREFIX_HINT}"), said


def test_the_spawners_token_found_in_the_state_folder_is_told_how_to_get_an_admins(
    tmp_path: Path, service: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / SERVICE_FILE).write_text(json.dumps({"url": "http://127.0.0.1:10101/services/gpupool/"}))
    (state / "gpupool-hub-token").write_text("hub-token\n")  # the spawners' token: custom:gpupool:leases
    said = _refusal(["mig", "advise", "--state-dir", str(state)], capsys)
    assert (
        said == f"gpupool: service hub may not read MIG advice: it needs custom:gpupool:admin; {ADMIN_HINT}"
    )


def test_a_users_token_on_an_admin_command_is_told_how_to_get_an_admins(
    service: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "http://127.0.0.1:10101/services/gpupool/"
    said = _refusal(["drain", "dgx-h100-01/0", "--url", url, "--token", "alice-token"], capsys)
    assert said == f"gpupool: user alice may not drain: it needs custom:gpupool:admin; {ADMIN_HINT}"


def test_a_refusal_at_the_services_own_url_has_no_hint() -> None:
    url = "http://hub.example.org/jhub/services/gpupool/api/v1/leases/L9"
    body = {"error": "not_found", "detail": "no lease L9"}
    with pytest.raises(GpupoolError) as raised:
        raise_for_problem(httpx.Response(404, json=body, request=httpx.Request("GET", url)))
    assert str(raised.value) == "no lease L9" and raised.value.error == "not_found"
