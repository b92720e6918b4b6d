"""The bad-input corpus: one table of (case id, input, expected error, message fragment).

Each ``cases_*.py`` beside this file holds ``CASES``, a list of rows
``(case_id, run, error, match)``:

* ``run(tmp_path)`` builds the input under ``tmp_path`` and hands it to tabstream
  (API or CLI, see ``_corpus.cli``);
* ``error`` is the exception type it must raise, or ``None`` when the input must be
  read correctly (``run`` then asserts the result against a plain pandas/numpy
  reading of the same input);
* ``match`` is a regular expression the error message must contain (the file, line,
  column or value it names); ``None`` with ``error=None``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # case modules import _corpus


def _load_cases() -> list:
    params = []
    for path in sorted(HERE.glob("cases_*.py")):
        spec = importlib.util.spec_from_file_location(f"bad_inputs_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for case_id, run, error, match in module.CASES:
            params.append(pytest.param(run, error, match, id=f"{path.stem[6:]}:{case_id}"))
    return params


CASES = _load_cases()


def test_corpus_is_not_empty():
    assert len(CASES) > 0


@pytest.mark.parametrize(("run", "error", "match"), CASES)
def test_bad_input(run, error, match, tmp_path):
    if error is None:
        run(tmp_path)
        return
    with pytest.raises(error, match=match):
        run(tmp_path)
