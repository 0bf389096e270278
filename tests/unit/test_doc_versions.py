"""Versions and releases as a user's clone shows them.

The version is pyproject.toml's. Every image tag the repository writes (`txnwatch:X.Y.Z`,
`txnwatch-collector:X.Y.Z`: README, docs, the Dockerfile's comments, the chart), the chart's version and appVersion
and the Dockerfile's VERSION label say it. CHANGELOG.md names each release with a commit this clone has, whose
pyproject.toml carries that version (a clone carries no tags, so the docs may not point at them), and lists the
current version. The docs, and the source's comments and docstrings, cite no `ARCHITECTURE.md` or issue number,
which a clone does not have.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
VERSION = str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
IMAGE_TAG = re.compile(r"txnwatch(?:-collector)?:(\d+\.\d+\.\d+)\b")
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\][^\n]*\n\nCommit `([0-9a-f]{7,40})`", re.M)
UNRELEASED = re.compile(r"^## \[Unreleased\] — (\d+\.\d+\.\d+)$", re.M)
NOT_IN_A_CLONE = re.compile(r"ARCHITECTURE\.md|\bissues? \d+\b|releases? (?:are|is) (?:git )?tags?", re.I)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def tracked_text_files() -> list[Path]:
    names = filter(None, git("ls-files", "-z").split("\0"))
    skip = (
        ".json",
        ".png",
        ".jar",
        ".gz",
    )  # benchmark results and pictures: measurements, not version claims
    return [ROOT / n for n in names if not n.endswith(skip) and (ROOT / n).is_file()]


def documents() -> list[Path]:
    return [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *ROOT.glob("helm/**/*.md"),
    ]


def stale_image_tags(text: str) -> list[str]:
    return [m.group(0) for m in IMAGE_TAG.finditer(text) if m.group(1) != VERSION]


def test_every_image_tag_is_the_projects_version() -> None:
    stale = []
    for path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        stale += [f"{path.relative_to(ROOT)}: {tag}" for tag in stale_image_tags(text)]
    assert not stale, f"image tags other than pyproject.toml's {VERSION}: {stale}"


def test_chart_and_image_label_carry_the_projects_version() -> None:
    chart = (ROOT / "helm" / "txnwatch" / "Chart.yaml").read_text()
    assert re.search(rf"^version: {re.escape(VERSION)}$", chart, re.M), "Chart.yaml version"
    assert re.search(rf'^appVersion: "{re.escape(VERSION)}"$', chart, re.M), "Chart.yaml appVersion"
    labels = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert labels and set(labels) == {VERSION}, f"Dockerfile ARG VERSION: {labels}"


def test_the_changelog_lists_this_version_and_releases_this_clone_has() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = RELEASE.findall(text)
    unreleased = UNRELEASED.findall(text)
    assert VERSION in [*unreleased, *(v for v, _ in releases)], f"CHANGELOG.md does not list {VERSION}"
    assert releases, "CHANGELOG.md names no release with its commit"
    for version, commit in releases:
        ancestor = subprocess.run(
            ["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT, check=False
        )
        assert ancestor.returncode == 0, f"release {version}: commit {commit} is not in this clone's history"
        released = tomllib.loads(git("show", f"{commit}:pyproject.toml"))["project"]["version"]
        assert released == version, f"release {version}: commit {commit} is version {released}"


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_nothing_a_clone_lacks(doc: Path) -> None:
    found = [m.group(0) for m in NOT_IN_A_CLONE.finditer(doc.read_text(encoding="utf-8"))]
    assert not found, f"{doc.relative_to(ROOT)} cites what a user's clone does not have: {found}"


# The shipped code and what builds and deploys it: its comments and docstrings say the reason itself.
SOURCE_FOLDERS = ("detectors", "common", "admin", "streaming", "dev", "deploy", "benchmarks", "helm")


def source_files() -> list[Path]:
    names = filter(None, git("ls-files", "-z", "--", *SOURCE_FOLDERS, "txnwatch_cli.py").split("\0"))
    tracked = {ROOT / n for n in names}
    return [p for p in tracked_text_files() if p in tracked]


def test_source_cites_nothing_a_clone_lacks() -> None:
    found = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in NOT_IN_A_CLONE.finditer(text)]
    assert not found, f"source citing what a user's clone does not have (say the reason itself): {found}"


def test_the_checks_catch_stale_text() -> None:
    # Each pattern must see what it is for, or the tests above pass on anything.
    stale = "txnwatch" + ":0.0.1"  # spelled so that this file does not fail its own image-tag check
    assert stale_image_tags(f"docker build -t registry.example.com/{stale} .") == [stale]
    assert stale_image_tags(f"localhost/txnwatch-collector:{VERSION}") == []
    assert len(NOT_IN_A_CLONE.findall("see ARCHITECTURE.md; issue 20 said; Releases are git tags")) == 3
    assert [p.relative_to(ROOT).as_posix() for p in source_files() if p.name == "tracking.py"] == [
        "detectors/tracking.py"
    ]
    assert RELEASE.findall("## [0.1.0] — 2026-11-23\n\nCommit `c2d7d13`. The first") == [("0.1.0", "c2d7d13")]
