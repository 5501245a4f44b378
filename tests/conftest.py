"""Test helpers live beside the tests (``builders``); make them importable."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from kube_cluster import LocalKube, local_kube


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    """The real control plane with the simulated nodes of ``tests/pools/kube.yaml``: once per test run."""
    with local_kube(tmp_path_factory.mktemp("kube")) as cluster:
        yield cluster
