"""Which of pyproject.toml's runtime dependencies each image target installs (the top-level Dockerfile).

The `collector` target runs `txnwatch collect`, `inspect` and `proposals`, which never import Spark: it gets the
core package's dependencies (`pip install txnwatch`). The `stream` target gets the stream extra on top (`spark`:
`pip install 'txnwatch[stream]'`, pyspark and the libraries only the streaming job's Python code uses). Both also
get the optional extras in IMAGE_EXTRAS (`extras`): an image cannot be pip-installed into later, so what an operator
may switch on by configuration alone must be in it. Standard library only: it runs in the base image before
anything is installed. The Dockerfile then installs the wheel with these extras from the index-less venv, so a
dependency the wheel declares and these lists missed fails the build.

    python requirements.py collector|spark|extras < pyproject.toml > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib

# The extra `txnwatch stream` needs, and what it holds: pyspark itself; pyarrow and pandas for the job's
# Arrow/pandas UDFs; protobuf for transformWithState's generated code.
STREAM_EXTRA = "stream"
SPARK_SIDE = frozenset({"pyspark", "pyarrow", "pandas", "protobuf"})

# msk: Amazon MSK IAM login for kafka-python (common/oauth.py), chosen by the Kafka client properties alone.
IMAGE_EXTRAS = ("msk",)


def distribution_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(0).lower().replace("_", "-")


def requirements(pyproject: str, side: str) -> list[str]:
    """The runtime requirements of one side, as pyproject.toml writes them: `collector` the core package's,
    `spark` the stream extra's."""
    project = tomllib.loads(pyproject)["project"]
    if side == "collector":
        return list(project["dependencies"])
    if side == "spark":
        return list(project["optional-dependencies"][STREAM_EXTRA])
    raise ValueError(f"side must be collector or spark, not {side!r}")


def extras_requirements(pyproject: str) -> list[str]:
    """The requirements of the optional extras every image carries (IMAGE_EXTRAS), as pyproject.toml writes them."""
    optional: dict[str, list[str]] = tomllib.loads(pyproject)["project"]["optional-dependencies"]
    return [d for extra in IMAGE_EXTRAS for d in optional[extra]]


if __name__ == "__main__":
    text, side = sys.stdin.read(), sys.argv[1]
    print("\n".join(extras_requirements(text) if side == "extras" else requirements(text, side)))
