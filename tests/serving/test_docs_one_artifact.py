"""The one-artifact example of docs/serving.md runs as written, and its exported
features equal ``Workflow.transform`` of the same request."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"

pytestmark = pytest.mark.torch


def _example() -> str:
    block = DOC.read_text().split("<!-- one-artifact-example", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


@pytest.mark.slow  # torch.export: ~20 s of CPU, 110 s wall on the loaded 2-core machine
def test_documented_one_artifact_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_example(), str(DOC), "exec"), scope)  # the snippet as a user runs it
    assert (tmp_path / "features.pt2").is_file()
    expected = scope["wf"].transform(scope["request"])  # the same rows, in Python
    got = scope["features"]
    np.testing.assert_array_equal(got["city"].numpy(), expected["city"].to_numpy())
    np.testing.assert_allclose(got["price"].numpy(), expected["price"].to_numpy(dtype=np.float32),
                               rtol=0, atol=1e-6)
    # what the comment in the example says
    assert got["city"].tolist() == [4, 2, 1]
    np.testing.assert_allclose(got["price"].numpy(), [np.log1p(2.0), 0.0, 0.0], atol=1e-4)
