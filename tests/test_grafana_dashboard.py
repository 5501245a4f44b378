"""The shipped Grafana dashboard against Debian's real Prometheus scraping a running gpupool service.

The service runs on the simulated demo pool with public metrics, sampling every half second, with granted and
queued leases made through its API and a week of stored per-minute usage. Prometheus (``/usr/bin/prometheus``,
which ``make test`` installs with apt) scrapes it every second; then every query of every panel of
``hub_config/grafana/gpupool.json`` is evaluated through Prometheus' HTTP API: each must parse and return data.
The token checks go to the stand-in hub of ``token_hub``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hub_harness import free_port, service_command, wait_for
from polling import pauses
from token_hub import token_hub

from gpupool.spawner.backends.simulated import DEMO_POOL
from gpupool.spawner.service.api.auth import ADMIN_SCOPE, LEASES_SCOPE
from gpupool.spawner.service.store.lease_store import LeaseStore, sqlite_url
from gpupool.spawner.service.store.usage_store import UsageStore
from gpupool.spawner.telemetry.aggregates import Holder, MinuteAggregate

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "hub_config" / "grafana" / "gpupool.json"
PROMETHEUS = Path("/usr/bin/prometheus")
HUB_TOKEN, ADMIN_TOKEN = "hub-token", "admin-token"
CALLERS = {
    HUB_TOKEN: {
        "name": "hub",
        "kind": "service",
        "scopes": [LEASES_SCOPE, "access:services!service=gpupool"],
    },
    ADMIN_TOKEN: {
        "name": "admin",
        "kind": "user",
        "scopes": [ADMIN_SCOPE, "access:services!service=gpupool"],
    },
}
README = ROOT / "README.md"


def readme_scrape_config(target: str, token_file: Path) -> dict[str, Any]:
    """The README's scrape job for gpupool, pointed at ``target`` and reading the admin's token from
    ``token_file``: the admin's copy and paste, checked against the real Prometheus."""
    block = re.search(r"```yaml\n(\s*scrape_configs:.*?)```", README.read_text(), re.S)
    assert block, "the README has no Prometheus scrape_configs block"
    config = yaml.safe_load(block.group(1))
    (job,) = config["scrape_configs"]
    job["authorization"]["credentials_file"] = str(token_file)
    job["static_configs"] = [{"targets": [target]}]
    return dict(config)


def _stored_usage(db_url: str) -> None:
    """A week of history: an hour a day of alice's H100, busy half of it, as the telemetry would have kept."""
    store = LeaseStore(db_url)
    try:
        minutes = [
            MinuteAggregate(
                "GPU-history", "dgx-h100-01", 0, None, 1_700_000_000 + day * 86400 + m * 60,
                Holder("alice", "h100", f"old-{day}"), 30, 60.0, 60.0, 30.0 if m % 2 else 0.0, 0.0,
                40.0, 80.0, 1024.0, 2048.0,
            )
            for day in range(7)
            for m in range(60)
        ]  # fmt: skip
        UsageStore(store.engine).add(minutes)
    finally:
        store.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grafana")
    db_url = sqlite_url(str(tmp / "gpupool.sqlite"))
    _stored_usage(db_url)
    port = free_port()
    with token_hub(CALLERS) as hub_api:
        env = os.environ | {
            "GPUPOOL_POOL": str(DEMO_POOL),
            "GPUPOOL_DB_URL": db_url,
            "GPUPOOL_SAMPLE_SECONDS": "0.5",
            "GPUPOOL_RECONCILE_SECONDS": "0",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_API_URL": hub_api,
        }
        log = tmp / "service.log"
        with log.open("wb") as out:
            process = subprocess.Popen(service_command(), env=env, cwd=tmp, stdout=out, stderr=out)
        url = f"http://127.0.0.1:{port}/services/gpupool/"
        try:
            wait_for(lambda: httpx.get(url + "metrics").status_code == 401, "the service's metrics", log, 60)
            spawner = httpx.Client(base_url=url + "api/v1", headers={"Authorization": f"token {HUB_TOKEN}"})
            for user, profile, n in (("alice", "mig-3g", 1), ("bob", "h100", 1), ("carol", "l4-quarter", 2)):
                for i in range(n):
                    body = {"user": user, "profile": profile, "owner_kind": "server", "owner_name": f"s{i}"}
                    assert spawner.post("/leases", json=body).status_code == 201
            yield f"127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus(service: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    if not PROMETHEUS.is_file():
        pytest.fail(f"{PROMETHEUS} is missing: `make test` installs it (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("prometheus")
    (tmp / "gpupool-token").write_text(ADMIN_TOKEN + "\n")
    config = readme_scrape_config(
        service, tmp / "gpupool-token"
    )  # an admin's token: the metrics are not public
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    log = tmp / "prometheus.log"
    command = [
        str(PROMETHEUS),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=10)
    try:

        def scraped_twice() -> bool:
            answer = client.get("/query", params={"query": "count_over_time(gpupool_queue_length[1m])"})
            if answer.status_code != 200:  # 503 while its storage starts
                return False
            result = answer.json()["data"]["result"]
            return bool(result) and float(result[0]["value"][1]) >= 3

        wait_for(scraped_twice, "Prometheus scraping gpupool", log, 60)
        yield client
    finally:
        process.terminate()
        process.wait(timeout=10)


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


@pytest.mark.parametrize(("panel", "query"), _queries())
def test_every_panel_query_parses_and_returns_data(prometheus: httpx.Client, panel: str, query: str) -> None:
    answer: dict[str, Any] = {}
    for _ in pauses(20):  # the first scrapes are in; a rate or increase may want one more
        response = prometheus.get("/query", params={"query": query})
        answer = (
            response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        )
        if answer.get("status") == "success" and answer["data"]["result"]:
            return
    pytest.fail(f"{panel}: {query} returned {answer}")


def test_the_dashboard_says_the_demo_pools_gpus_are_simulated(prometheus: httpx.Client) -> None:
    """An admin trial found every other view of a simulated pool saying so, and the dashboard not."""
    (panel,) = [
        p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Devices: real or simulated"
    ]
    (target,) = panel["targets"]
    (series,) = prometheus.get("/query", params={"query": target["expr"]}).json()["data"]["result"]
    shown = panel["fieldConfig"]["defaults"]["mappings"][0]["options"][series["value"][1]]["text"]
    assert shown == "SIMULATED: not real GPUs"


def test_device_series_join_lease_info_on_dcgm_exporters_labels(prometheus: httpx.Client) -> None:
    query = "gpupool_lease_info * on (device) group_left () gpupool_gpu_utilization_ratio"
    result = prometheus.get("/query", params={"query": query}).json()["data"]["result"]
    users = {series["metric"]["user"] for series in result}
    assert users == {"alice", "bob", "carol"}
    for series in result:
        labels = series["metric"]
        assert labels["Hostname"] and labels["gpu"].isdigit() and labels["UUID"].startswith("GPU-")
        assert (labels.get("GPU_I_PROFILE") == "3g.40gb") is (labels["user"] == "alice")  # empty: no label
