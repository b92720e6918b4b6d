"""Keep TensorFlow quiet in these tests (set before TensorFlow is first imported) and
make the helper module ``tf_synthetic`` importable under ``--import-mode=importlib``."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # no oneDNN banner or round-off noise

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
