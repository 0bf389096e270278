"""The unit tier stands alone: `make test-unit` needs the venv only (no Maven jars, no JVM, no broker), and no unit
test reads what `make jars` fetches into the cache folder, except the codec's Kafka-schema oracle, marked `jars`
(left out by `make test-unit`, run by `make test`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "tests" / "unit"
CACHE = "." + "cache"  # spelled so that this file does not match its own check


def _prerequisites(makefile: str, target: str) -> list[str]:
    (line,) = [ln for ln in makefile.splitlines() if re.match(rf"^{re.escape(target)}\s*:(?!=)", ln)]
    return line.split(":", 1)[1].replace("|", " ").split()


def test_make_test_unit_needs_no_jars() -> None:
    prerequisites = _prerequisites((ROOT / "Makefile").read_text(), "test-unit")
    assert prerequisites == ["venv"]


def test_the_prerequisite_reader() -> None:
    assert _prerequisites("test-unit: venv jars\n\tpytest\n", "test-unit") == ["venv", "jars"]
    assert _prerequisites("x := 1\ntest-unit: venv | deps\n", "test-unit") == ["venv", "deps"]


def _reads_the_cache(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=path.name)
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and CACHE in n.value.split("/")
        for n in ast.walk(tree)
    )


def _unit_files() -> list[Path]:
    # test_codec.py's oracle reads Kafka's own schemas from the broker jar (never copied into the repo); those
    # tests carry the `jars` mark, which `make test-unit` deselects (checked below) and `make test` runs.
    return [p for p in sorted(UNIT.rglob("*.py")) if p.name != "test_codec.py"]


def test_make_test_unit_deselects_the_jar_tests() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest-unit:", 1)[1].split("\n\n", 1)[0]
    assert '-m "not jars"' in recipe
    codec = (UNIT / "test_codec.py").read_text()
    assert codec.count("@JARS") == 4 and _reads_the_cache(UNIT / "test_codec.py")


@pytest.mark.parametrize("path", _unit_files(), ids=lambda p: p.name)
def test_no_unit_test_reads_the_jar_cache(path: Path) -> None:
    assert not _reads_the_cache(path)
