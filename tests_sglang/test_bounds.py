"""Host indices outside SGLang's host pool, on every v1/v2 path, through the backend SGLang's
server controller built (issue 32): a typed error naming the index, nothing copied, nothing stored."""

from __future__ import annotations

import pytest

from harness import launch


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["gqa", "dsa"])
def test_out_of_range_indices_are_refused_and_change_nothing(kind: str) -> None:
    (res,) = launch(1, "bad_indices", kind=kind)
    outcomes = res["outcomes"]
    paths = {name.split("/")[0] for name in outcomes}
    assert paths >= {"batch_set_v1", "batch_get_v1", "batch_set_v2", "batch_get_v2"}
    if kind == "dsa":
        assert paths >= {"batch_set_v2_indexer", "batch_get_v2_indexer"}
    for name, outcome in outcomes.items():
        assert outcome.startswith("InvalidArgumentError"), (name, outcome)
        assert "CHANGED STATE" not in outcome, (name, outcome)
        if not name.endswith("/short"):
            assert "host index" in outcome, (name, outcome)  # names the offending index
        else:
            assert "host indices for 2 pages" in outcome, (name, outcome)
    # The backend still serves good indices afterwards.
    assert res["good_read"] == [True, True] and res["wrong"] == 0
