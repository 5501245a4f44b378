"""Random YAML values for damaging a known-good file: plausible words mixed with junk, nested a little."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st


def yaml_values(words: Sequence[object], keys: Sequence[object], largest: int) -> st.SearchStrategy[object]:
    """Scalars (the given ``words`` among them), and lists and mappings of them keyed by ``keys``."""
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-5, largest),
        st.floats(allow_nan=True),
        st.text(max_size=12),
        st.sampled_from(list(words)),
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(list(keys)), inner, max_size=3)
        ),
        max_leaves=8,
    )
