"""The docs cite only paths a user's clone has.

A newcomer follows README.md and docs/ from a clone of this repository and nothing else: a cited file that was
renamed or deleted, or a path outside the repository (the developers' `../shared/` notes), is a dead end. This
test reads every Markdown document, its relative links and the repository paths it names in backticks, and checks
each against the work tree; and it checks that no tracked text file cites the notes outside the repository.
"""

from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# A backticked token is taken for a repository path when its first component is one of the repository's own
# top-level entries; everything else in backticks (topic names, URLs, metric names, shell lines) is left alone.
# Generated and git-ignored: `make` creates them, a clone does not have them yet (the cache's name is built so
# that tests/unit/test_unit_tier.py, which keeps unit tests off the jar cache, does not take this for a read).
GENERATED = tuple(f".{name}/" for name in ("cache", "venv"))
TOP_LEVEL = {
    p.name
    for p in ROOT.iterdir()
    if f"{p.name}/" not in (".git/", *GENERATED) and not p.name.endswith("_cache")
}

LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w./-])notes/[\w.-]+\.md|(?<![\w./-])seeds/")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("helm/**/*.md"))]


def _path_part(token: str) -> str:
    # `streaming/job.py:248`, `tests/unit/test_x.py::test_y`, `docs/runbook.md#view-behind`, `detectors/ (pure)`
    token = token.split("::")[0].split("#")[0].split()[0] if token.strip() else ""
    token = re.sub(r":\d+(-\d+)?$", "", token)
    return token.rstrip(".,;:)")


def _cited_paths(doc: Path) -> list[tuple[str, Path]]:
    text = doc.read_text(encoding="utf-8")
    cited: list[tuple[str, Path]] = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        path = _path_part(target)
        if path:
            cited.append((target, (doc.parent / path).resolve()))
    for token in CODE.findall(text):
        path = _path_part(token)
        first = path.split("/")[0]
        if "/" not in path or first not in TOP_LEVEL or path.startswith(GENERATED):
            continue
        cited.append((token, (ROOT / path).resolve()))
    return cited


def _exists(path: Path) -> bool:
    if any(c in str(path) for c in "*?[{<"):
        # `{servicemonitors,prometheusrules}` alternatives and `<name>` placeholders stand for any name
        pattern = re.sub(r"\{[^}]*\}|<[^>]*>", "*", str(path))
        return bool(glob.glob(pattern, recursive=True))
    return path.exists()


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_path_exists(doc: Path) -> None:
    missing = [
        token
        for token, path in _cited_paths(doc)
        if not _exists(path)
        or ROOT not in (path, *path.parents)  # a link out of the repository counts as missing
    ]
    assert not missing, f"{doc.relative_to(ROOT)} cites paths a clone does not have: {sorted(set(missing))}"


def test_nothing_cites_the_notes_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    offenders = []
    for name in filter(None, tracked):
        path = ROOT / name
        if path.suffix not in {".md", ".py", ".yaml", ".yml", ".toml", ".tpl", ".txt", ".json", ""}:
            continue
        if name == "tests/unit/test_doc_paths.py" or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        offenders += [f"{name}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
    assert not offenders, f"files cite notes a user's clone does not have: {offenders}"


def test_the_check_catches_a_dead_path(tmp_path: Path) -> None:
    # The extraction must see both forms, or the tests above pass on anything.
    doc = tmp_path / "doc.md"
    doc.write_text("See [the runbook](runbook-gone.md#x) and `detectors/no_such_module.py:12`.\n")
    cited = {token for token, path in _cited_paths(doc) if not _exists(path)}
    assert cited == {"runbook-gone.md#x", "detectors/no_such_module.py:12"}
