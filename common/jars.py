"""Where the jars `make jars` fetches are found, answered once for the streaming job (Spark's Kafka connector and
s3a, in `spark/`), the test bed (the Kafka broker and its tools, in `kafka/`) and the benchmarks.

The job's own setting is `Settings.stream.jars_dir` (TXNWATCH_STREAM__JARS_DIR, or TXNWATCH_JARS_DIR as before);
code that has no settings (dev/, benchmarks/, a session built without them) asks `jars_dir()`.
"""

from __future__ import annotations

import os
from pathlib import Path

# The checkout this module sits in; `make jars` fills its .cache/jars (git-ignored).
CHECKOUT = Path(__file__).resolve().parent.parent
CHECKOUT_JARS_DIR = CHECKOUT / ".cache" / "jars"
# The variable the test bed has always read; Settings reads it into stream.jars_dir too (common/settings.py).
JARS_DIR_VARIABLE = "TXNWATCH_JARS_DIR"


def jars_dir(configured: Path | None = None) -> Path:
    """The jars folder: `configured` (the job's Settings.stream.jars_dir) when given, else TXNWATCH_JARS_DIR when
    set, else the checkout's .cache/jars."""
    if configured is not None:
        return configured
    return Path(os.environ.get(JARS_DIR_VARIABLE) or CHECKOUT_JARS_DIR)
