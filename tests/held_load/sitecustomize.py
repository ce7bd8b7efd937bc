"""Put on PYTHONPATH with ``ATTNLAB_TEST_HOLD_LOAD`` naming a file, this holds every SmolLM2 load of the process
(the lab's marimo server) until that file exists (at most 120 s), so a browser test can use the page while the model
is certainly still loading (tests/test_lab_browser_lessons.py)."""

import os
import time

_RELEASE = os.environ.get("ATTNLAB_TEST_HOLD_LOAD")

if _RELEASE:
    from attnlab.models import gguf

    _load = gguf.load_smollm2

    def _held_load():
        deadline = time.monotonic() + 120
        while not os.path.exists(_RELEASE) and time.monotonic() < deadline:
            time.sleep(0.05)
        return _load()

    gguf.load_smollm2 = _held_load
