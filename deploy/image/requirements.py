"""Which of pyproject.toml's runtime dependencies each image target installs (the top-level Dockerfile).

The `collector` target runs `txnwatch collect` and `txnwatch proposals`, which never import Spark: it gets every
dependency except the Spark side (pyspark and the libraries only the streaming job's Python code uses). The
`stream` target gets the Spark side on top. Standard library only: it runs in the base image before anything is
installed.

    python requirements.py collector|spark < pyproject.toml > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib

# pyspark itself; pyarrow and pandas for the job's Arrow/pandas UDFs; protobuf for transformWithState's
# generated code.
SPARK_SIDE = frozenset({"pyspark", "pyarrow", "pandas", "protobuf"})


def distribution_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(0).lower().replace("_", "-")


def requirements(pyproject: str, side: str) -> list[str]:
    """The runtime requirements of one side (`collector` or `spark`), as pyproject.toml writes them."""
    if side not in ("collector", "spark"):
        raise ValueError(f"side must be collector or spark, not {side!r}")
    deps: list[str] = tomllib.loads(pyproject)["project"]["dependencies"]
    return [d for d in deps if (distribution_name(d) in SPARK_SIDE) == (side == "spark")]


if __name__ == "__main__":
    print("\n".join(requirements(sys.stdin.read(), sys.argv[1])))
