"""Shared pieces for the bad-input corpus (see ``test_corpus.py``)."""

from __future__ import annotations

import contextlib
import io

from tabstream.cli import main


class CliFailed(Exception):
    """``tabstream`` exited non-zero; the message is what it printed on stderr."""


def cli(*argv: str) -> str:
    """Run the ``tabstream`` command in-process. Returns stdout; raises
    :class:`CliFailed` with stderr when it fails. A traceback on stderr is itself a
    failure of the corpus case: a user must get one line plus a hint."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    text = err.getvalue()
    assert "Traceback" not in text, f"tabstream {' '.join(map(str, argv))} printed a traceback:\n{text}"
    if code != 0:
        assert "hint:" in text, f"no hint in the error output:\n{text}"
        raise CliFailed(text.strip())
    return out.getvalue()
