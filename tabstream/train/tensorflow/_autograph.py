"""AutoGraph opt-out for tabstream's layer and optimizer methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

F = TypeVar("F", bound=Callable[..., Any])


def no_autograph(fn: F) -> F:
    """Mark ``fn`` as plain Python plus TF ops. Called inside a user's ``tf.function``,
    AutoGraph would otherwise rewrite it (and everything it calls) from source on the
    first trace, which takes seconds per function; none of these methods branch on
    tensor values, so they need no conversion."""
    return tf.autograph.experimental.do_not_convert(fn)
