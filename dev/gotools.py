"""Go tools the operations tests need, built once from the Go module proxy into .cache/bin/ (named by version).

No release binaries can be downloaded on the machines this project runs on, only Go modules; so `promtool`,
`prometheus`, `helm` and `kubeconform` are built with `go install` (build times and the
flags each needs: docs/testbed.md). A second call finds the binary and returns at once; concurrent callers (two test
processes, `make` and a test) wait on one file lock instead of building twice.

    python -m dev.gotools ensure promtool prometheus     # prints the paths
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN_DIR = Path(os.environ.get("TXNWATCH_TOOLS_DIR", ROOT / ".cache" / "bin"))


@dataclass(frozen=True)
class GoTool:
    package: str
    version: str
    tags: tuple[str, ...] = ()
    ldflags: str = ""

    def binary_name(self, name: str) -> str:
        return f"{name}-{self.version}"


# Prometheus 3.x is tagged v0.3xx.y in Go; `remove_all_sd` drops the service-discovery plugins, one of whose
# dependencies the proxy refuses. The ldflags give each binary its real version string in `--version`.
TOOLS: dict[str, GoTool] = {
    "promtool": GoTool(
        "github.com/prometheus/prometheus/cmd/promtool",
        "v0.316.0",
        tags=("remove_all_sd",),
        ldflags="-X github.com/prometheus/common/version.Version=3.16.0",
    ),
    "prometheus": GoTool(
        "github.com/prometheus/prometheus/cmd/prometheus",
        "v0.316.0",
        tags=("remove_all_sd",),
        ldflags="-X github.com/prometheus/common/version.Version=3.16.0",
    ),
    "helm": GoTool(
        "helm.sh/helm/v3/cmd/helm",
        "v3.22.0",
        ldflags="-X helm.sh/helm/v3/internal/version.version=v3.22.0",
    ),
    "kubeconform": GoTool("github.com/yannh/kubeconform/cmd/kubeconform", "v0.8.0"),
}


class ToolBuildError(RuntimeError):
    pass


@contextmanager
def _build_lock() -> Iterator[None]:
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    with open(BIN_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def tool_path(name: str) -> Path:
    return BIN_DIR / TOOLS[name].binary_name(name)


def ensure(name: str) -> Path:
    """The path of a built tool, building it first when it is not there yet."""
    if name not in TOOLS:
        raise ToolBuildError(f"unknown tool {name!r}; known: {', '.join(sorted(TOOLS))}")
    target = tool_path(name)
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise ToolBuildError(
            f"{name} is built from the Go module proxy and needs `go` on PATH (Debian: golang-go)"
        )
    with _build_lock():
        if target.exists():  # built by another process while we waited
            return target
        tool = TOOLS[name]
        print(
            f"building {name} {tool.version} from the Go module proxy (once; cached in {BIN_DIR})",
            file=sys.stderr,
        )
        with tempfile.TemporaryDirectory(prefix=f"gobuild-{name}-") as gobin:
            cmd = [go, "install"]
            if tool.tags:
                cmd += ["-tags", ",".join(tool.tags)]
            if tool.ldflags:
                cmd += ["-ldflags", tool.ldflags]
            cmd.append(f"{tool.package}@{tool.version}")
            env = {**os.environ, "GOBIN": gobin, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise ToolBuildError(f"`{' '.join(cmd)}` failed:\n{done.stderr[-4000:]}")
            built = Path(gobin) / Path(tool.package).name
            tmp_target = target.with_suffix(".part")
            shutil.copy2(built, tmp_target)
            tmp_target.replace(target)  # atomic: a reader never sees half a binary
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.gotools", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ens = sub.add_parser("ensure", help="build the named tools if missing and print their paths")
    ens.add_argument("names", nargs="+", choices=sorted(TOOLS))
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(ensure(name))
    except ToolBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
