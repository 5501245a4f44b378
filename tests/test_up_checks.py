"""What ``gpupool up`` refuses before it starts anything, said in words that point at the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.spawner.hub.up_checks import UpError, check_request


@pytest.mark.parametrize(
    ("pool", "extra", "said"),
    [
        ("{tmp}", (), "--pool {tmp}: a folder, not a file"),  # a trial passed its pools folder
        ("{tmp}/lab.yaml", (), "--pool {tmp}/lab.yaml: no such file"),
        (None, ("{tmp}",), "-f {tmp}: a folder, not a file"),
    ],
)
def test_a_pool_or_config_that_is_no_file_is_refused_saying_what_it_is(
    tmp_path: Path, pool: str | None, extra: tuple[str, ...], said: str
) -> None:
    given = pool.format(tmp=tmp_path) if pool else None
    with pytest.raises(UpError) as refused:
        check_request("127.0.0.1", given, tuple(e.format(tmp=tmp_path) for e in extra), True, None)
    assert str(refused.value) == said.format(tmp=tmp_path)
