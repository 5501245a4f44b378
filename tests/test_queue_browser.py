"""A researcher's wait for a full pool, in headless Chromium: position, expected start, and a GPU in the end.

Finding 1 of the researcher's-day review: under ``make run`` the queue gave up after 60 s, said nothing of
when a GPU might come, and nothing ever made room. Here ``gpupool up`` runs on a pool of one H100, held by the
same researcher's checkpointing training job (20 minutes at most). They ask for an H100 server in the spawn
form: the progress page says they are next and when they can expect to start; after 70 s, longer than the
60 s the queue used to give up after (``GPUPOOL_PREEMPT_AFTER_SECONDS=70``), the pool preempts the job, the
server starts in JupyterLab, and once the server stops the job resumes from its checkpoint and finishes. The waiting page is saved as
``queue-waiting.png`` under ``test-artifacts/``.
"""

from __future__ import annotations

import contextlib
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_harness import artifacts, chromium, log_in, screenshot_on_failure
from job_user import train_script
from playwright.sync_api import Page, expect
from up_harness import Up, api_token, extra_config, free_port_family, login, require_proxy, start_up

from gpupool.spawner.names import SERVICE_PREFIX

ONE_H100 = """nodes:
  - name: box-01
    cpu: 64
    memory: 512GiB
    gpus: {product: H100-80GB, count: 1}
"""
PREEMPT_AFTER = 70
EVERY = 50  # steps between checkpoints
STEPS = 1200  # 120 s at 0.1 s a step: still running when the preemption comes, 70 s into the wait
TRAIN = ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--step-seconds", "0.1"]


def test_with_the_pool_full_the_wait_shows_an_expected_start_and_a_preempted_job_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_proxy()
    monkeypatch.setenv("GPUPOOL_PREEMPT_AFTER_SECONDS", str(PREEMPT_AFTER))
    pool = tmp_path / "one-h100.yaml"
    pool.write_text(ONE_H100)
    up = start_up(
        tmp_path, tmp_path / "state", free_port_family(), extra_config(tmp_path), pool=("--pool", str(pool))
    )
    try:
        with contextlib.closing(login(up)) as session:
            token = api_token(session)
        auth = {"Authorization": f"token {token}"}
        service = httpx.Client(base_url=f"{up.url}{SERVICE_PREFIX}api/v1", headers=auth, timeout=30)
        job = _running_training_job(service, up)
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            with screenshot_on_failure(page, "queue-failed.png"):
                _ask_for_an_h100(page, up)
                progress = page.locator("#progress-message")
                expect(progress).to_contain_text("you are next; expected to start by", timeout=60_000)
                assert re.search(r"in about (1[5-9]|20) min", progress.inner_text()), progress.inner_text()
                page.screenshot(path=str(artifacts() / "queue-waiting.png"))
                asked = time.monotonic()
                page.wait_for_url(re.compile(r"/user/demo/lab"), timeout=(PREEMPT_AFTER + 150) * 1000)
                assert time.monotonic() - asked >= PREEMPT_AFTER - 30  # it waited for the preemption
                expect(page.locator("#jp-main-dock-panel")).to_be_visible(timeout=120_000)
        preempted = service.get(f"/jobs/{job['id']}").json()
        assert preempted["state"] in ("requeued", "queued"), preempted
        hub = httpx.Client(base_url=f"{up.url}/hub/api", headers=auth, timeout=30)
        assert hub.delete("/users/demo/server").status_code in (202, 204)
        _resumes_and_finishes(service, job["id"], up)
    finally:
        up.stop()


def _running_training_job(service: httpx.Client, up: Up) -> dict[str, Any]:
    created = service.post(
        "/jobs", json={"command": ["python", train_script(), *TRAIN], "profile": "h100", "max_runtime": "20m"}
    )
    assert created.status_code == 201, created.text
    job: dict[str, Any] = created.json()
    deadline = time.monotonic() + 90
    url = f"/jobs/{job['id']}"
    while "step 20/" not in service.get(f"{url}/logs").text:
        assert time.monotonic() < deadline, f"{service.get(url).json()}\n{up.log_tail()}"
        time.sleep(0.5)
    return job


def _ask_for_an_h100(page: Page, up: Up) -> None:
    log_in(page, up.url, "demo", up.password, lands=r"/hub/spawn")
    page.check("#gpupool-profile-h100")
    page.click('form button[type="submit"]')
    page.wait_for_url(re.compile(r"/hub/spawn-pending/demo"), timeout=30_000)


def _resumes_and_finishes(service: httpx.Client, job_id: str, up: Up) -> None:
    deadline = time.monotonic() + 300
    while (job := service.get(f"/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"{job}\n{up.log_tail()}"
        time.sleep(1)
    assert job["state"] == "succeeded", job
    log = service.get(f"/jobs/{job_id}/logs").text
    before, after = log.split("resumed at step ")
    lost = max(int(n) for n in re.findall(r"step (\d+)/", before)) - int(after.split()[0])
    assert 0 <= lost <= EVERY, log  # at most one checkpoint interval redone
    assert f"done: {STEPS} steps" in after
