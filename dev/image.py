"""The container images, built and run on machines without a Docker engine or a reachable container registry.

It owns `make image`: both targets of the top-level Dockerfile (`collector` and `stream`) built with buildah, on
base images it makes from Debian's packages with mmdebstrap (the Dockerfile's defaults are the public
`python:3.11-slim-bookworm` and `maven` images, which cannot be pulled here). Everything lives in the project:
the image store is `~/.cache/txnwatch/containers/` (`TXNWATCH_IMAGE_STORE` to move it; buildah's
`--root`/`--runroot`, so no host configuration file is read or edited), shared by every checkout on the machine,
and the build records are in the checkout's `.cache/image/`.

A build is skipped when an image of that target already carries the hash of its inputs (the Dockerfile, the
files it copies, the base images, the build arguments) as a label; otherwise buildah builds with `--layers`, so
a source change reuses the layers of the jars, the Python dependencies and the JRE. It also runs them for the
tests (`container`): `buildah run` with chroot isolation and the host's network, as a non-root user, with the
root file system mounted read-only and a tmpfs on /tmp, as the Helm chart runs them.

    python -m dev.image build              # both targets (make image); prints the image names
    python -m dev.image sizes              # their sizes
    python -m dev.image release            # before deleting .cache/ (make clean)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The image store outlives a checkout (like Go's build cache): a fresh clone on the same machine, as CI makes one
# for every run, reuses the bases and the layers instead of building all of it again (minutes, cold).
STORE = Path(
    os.environ.get("TXNWATCH_IMAGE_STORE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txnwatch" / "containers"
)
RECORDS = ROOT / ".cache" / "image"
# overlay works on this project's machines (ext4 root) and stores a layer as its difference, so `--layers`
# caching costs little disk; vfs (TXNWATCH_IMAGE_DRIVER=vfs) copies every layer whole, for hosts without overlay.
DRIVER = os.environ.get("TXNWATCH_IMAGE_DRIVER", "overlay")
TARGETS = ("collector", "stream")
# What the Dockerfile copies into the build context (.dockerignore lets through exactly these).
CONTEXT_PATHS = (
    "pyproject.toml",
    "README.md",
    "txnwatch_cli.py",
    "detectors",
    "common",
    "admin",
    "streaming",
    "dev/jvm",
    "deploy/image",
)
INPUTS_LABEL = "io.txnwatch.image.inputs"
DANGLING_LIMIT = 80
# The Dockerfile's OCI labels that take a build argument.
OCI_LABEL_ARGS = {
    "org.opencontainers.image.version": "VERSION",
    "org.opencontainers.image.revision": "REVISION",
    "org.opencontainers.image.source": "SOURCE",
}
DEBIAN_SUITE = "bookworm"
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
TOOL_PACKAGES = {"buildah": "buildah", "mmdebstrap": "mmdebstrap"}


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Base:
    """A base image made from Debian's packages, standing in for a public image the Dockerfile names."""

    name: str
    build_arg: str
    packages: tuple[str, ...]

    def tag(self) -> str:
        cas = [hashlib.sha256(c.read_bytes()).hexdigest() for c in host_ca_certificates()]
        recipe = json.dumps([DEBIAN_SUITE, "minbase", self.packages, cas]).encode()
        return f"localhost/txnwatch-base-{self.name}:{DEBIAN_SUITE}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def host_ca_certificates() -> list[Path]:
    """The certificate authorities this host adds to Debian's (a TLS-inspecting proxy's, on this project's
    machines): the bases trust them too, or pip and Maven could not reach PyPI and Maven Central while building."""
    return sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []


# python:3.11-slim-bookworm: Debian bookworm's Python is 3.11 too; python-is-python3 gives the `python` command.
# maven:3.9-eclipse-temurin-17: Debian's Maven 3.8 and JDK 17 (what `make jars` uses on the host).
BASES = (
    Base("python", "PYTHON_IMAGE", ("python3", "python3-venv", "python-is-python3", "ca-certificates")),
    Base("maven", "MAVEN_IMAGE", ("maven", "openjdk-17-jdk-headless", "ca-certificates")),
)


def image_name(target: str) -> str:
    return {"collector": "localhost/txnwatch-collector", "stream": "localhost/txnwatch"}[
        target
    ] + f":{version()}"


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# --- buildah ---------------------------------------------------------------------------------------------------


def buildah_cmd(*args: str) -> list[str]:
    return [
        "buildah",
        "--root",
        str(STORE / "storage"),
        "--runroot",
        str(STORE / "run"),
        "--storage-driver",
        DRIVER,
        *args,
    ]


def buildah(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(buildah_cmd(*args), capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ImageError(f"`buildah {' '.join(args)}` failed:\n{done.stderr[-4000:]}")
    return done.stdout.strip()


def ensure_tools() -> None:
    """buildah and mmdebstrap from Debian, installed when missing (as `make deps` installs the JDK)."""
    missing = [pkg for tool, pkg in TOOL_PACKAGES.items() if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageError(
            f"the image needs {', '.join(missing)} (Debian packages); install them as root: "
            f"apt-get install -y {' '.join(missing)}"
        )
    print(f"installing {', '.join(missing)} from Debian", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise ImageError(f"`{' '.join(cmd)}` failed:\n{done.stderr[-4000:]}")


def image_exists(name: str) -> bool:
    done = subprocess.run(
        buildah_cmd("inspect", "--type", "image", name), capture_output=True, text=True, check=False
    )
    return done.returncode == 0


def image_labels(name: str) -> dict[str, str]:
    config = json.loads(buildah("inspect", "--type", "image", name))
    return dict(config.get("OCIv1", {}).get("config", {}).get("Labels") or {})


def image_size(name: str) -> int:
    """Bytes of the image's layers, uncompressed, as `buildah images` counts them (it prints them rounded to
    three or four digits, "1.23 GB", in powers of 1000)."""
    (row,) = [r for r in json.loads(buildah("images", "--json", name)) if name in (r.get("names") or [])]
    number, unit = str(row["size"]).split()
    return round(float(number) * {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit])


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """One build at a time: `make image` and a test process wait for each other instead of building twice."""
    RECORDS.mkdir(parents=True, exist_ok=True)
    with open(RECORDS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- bases ---------------------------------------------------------------------------------------------------


def ensure_base(base: Base) -> str:
    """The base image's name, made first (mmdebstrap, about 20-60 s) when this store does not have it."""
    tag = base.tag()
    if image_exists(tag):
        return tag
    print(f"making base image {tag} from Debian packages ({', '.join(base.packages)})", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="txnwatch-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(base.packages)]
        if host_ca_certificates():
            cmd += [f"--customize-hook=copy-in {LOCAL_CAS} {LOCAL_CAS.parent}"]
            cmd += ['--customize-hook=chroot "$1" update-ca-certificates']
        cmd += [DEBIAN_SUITE, str(rootfs)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"`{' '.join(cmd)}` failed:\n{done.stderr[-4000:]}")
        ctr = buildah("from", "scratch")
        try:
            buildah("add", ctr, str(rootfs), "/")
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "/bin/bash",
                ctr,
            )
            buildah("commit", "--quiet", ctr, tag)
        finally:
            subprocess.run(buildah_cmd("rm", ctr), capture_output=True, check=False)
    return tag


# --- inputs and build ------------------------------------------------------------------------------------------


def context_files() -> list[Path]:
    files: list[Path] = []
    for rel in CONTEXT_PATHS:
        path = ROOT / rel
        if path.is_file():
            files.append(path)
        else:
            files += sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
            )
    return files


def inputs_key(build_args: Mapping[str, str], base_ids: Sequence[str]) -> str:
    """A hash of everything the build reads: the Dockerfile, .dockerignore, every file of the build context,
    the base images' ids and the build arguments that change the image's content. The revision label is left
    out: a commit that changes none of the inputs reuses the image (its revision label names the commit that
    built it)."""
    h = hashlib.sha256()
    for path in [ROOT / "Dockerfile", ROOT / ".dockerignore", *context_files()]:
        h.update(str(path.relative_to(ROOT)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    for key in sorted(build_args):
        if key != "REVISION":
            h.update(f"{key}={build_args[key]}\0".encode())
    for image_id in base_ids:
        h.update(image_id.encode() + b"\0")
    return h.hexdigest()


def revision() -> str:
    """The commit the sources come from; `-dirty` when the build context differs from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return ""
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "Dockerfile", ".dockerignore", *CONTEXT_PATHS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def source_url() -> str:
    done = subprocess.run(
        ["git", "config", "--get", "remote.origin.url"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


@dataclass(frozen=True)
class Built:
    target: str
    name: str
    cached: bool
    seconds: float
    size_bytes: int


def build(targets: Sequence[str] = TARGETS) -> list[Built]:
    """Both targets (or the ones named), each skipped when its image carries the current inputs' hash."""
    ensure_tools()
    out: list[Built] = []
    with _lock():
        bases = {b.build_arg: ensure_base(b) for b in BASES}
        base_ids = [
            buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", t) for t in bases.values()
        ]
        args = {**bases, "VERSION": version(), "REVISION": revision(), "SOURCE": source_url()}
        key = inputs_key(args, base_ids)
        for target in targets:
            name = image_name(target)
            began = time.monotonic()
            cached = image_exists(name) and image_labels(name).get(INPUTS_LABEL) == key
            if not cached:
                print(f"building {name} (target {target}) with buildah", file=sys.stderr)
                cmd = ["bud", "--isolation", "chroot", "--pull-never", "--layers", "--target", target]
                cmd += ["--tag", name, "--file", str(ROOT / "Dockerfile")]
                for k, v in args.items():
                    cmd += ["--build-arg", f"{k}={v}"]
                # buildah 1.28's layer cache does not compare build argument values: a cached
                # `LABEL ...=${REVISION}` keeps the revision of the build that made it. Labels given here are
                # set last and never come from the cache.
                for label, arg in OCI_LABEL_ARGS.items():
                    cmd += ["--label", f"{label}={args[arg]}"]
                cmd += ["--label", f"{INPUTS_LABEL}={key}"]
                log = RECORDS / f"{target}.log"
                with log.open("w") as log_file:
                    done = subprocess.run(
                        buildah_cmd(*cmd, str(ROOT)), stdout=log_file, stderr=subprocess.STDOUT, check=False
                    )
                if done.returncode != 0:
                    raise ImageError(
                        f"building {target} failed:\n{log.read_text()[-6000:]}\n(the whole log: {log})"
                    )
                _prune_when_many_dangling()
            built = Built(target, name, cached, round(time.monotonic() - began, 1), image_size(name))
            (RECORDS / f"{target}.json").write_text(json.dumps({"inputs": key, **built.__dict__}, indent=2))
            out.append(built)
    return out


def _prune_when_many_dangling(limit: int = DANGLING_LIMIT) -> None:
    """Layers of earlier builds pile up (each source change leaves a few untagged images); past `limit` they are
    removed, which also drops the layer cache: the next build redoes the dependency steps once."""
    dangling = buildah("images", "--filter", "dangling=true", "--quiet").split()
    if len(dangling) > limit:
        print(f"removing {len(dangling)} untagged images of earlier builds", file=sys.stderr)
        subprocess.run(buildah_cmd("rmi", "--prune"), capture_output=True, check=False)  # best effort


# --- running an image as the chart runs it ----------------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """A working container of an image whose root file system is mounted read-only (the chart's
    `readOnlyRootFilesystem`), with `run()` giving the argv of a command in it."""

    id: str
    rootfs: Path

    def run(
        self, *cmd: str, user: str = "10001:10001", env: Mapping[str, str] | None = None, tmpfs: str = "/tmp"
    ) -> list[str]:
        """`buildah run` of `cmd`: chroot isolation, the host's network, `user`, a tmpfs at `tmpfs` (the chart's
        emptyDir) and every capability dropped."""
        argv = ["run", "--isolation", "chroot", "--network", "host", "--user", user, "--cap-drop", "all"]
        argv += ["--mount", f"type=tmpfs,destination={tmpfs}"]
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        return buildah_cmd(*argv, self.id, "--", *cmd)

    def processes(self) -> list[int]:
        """The host pids of the processes running inside this container: those whose root directory is this
        container's root file system (chroot isolation shares the host's pid namespace)."""
        root = os.stat(self.rootfs)
        out: list[int] = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    theirs = os.stat(proc / "root")
                    if (theirs.st_dev, theirs.st_ino) == (root.st_dev, root.st_ino):
                        out.append(int(proc.name))
        return out


def process_uid(pid: int) -> int:
    """The real uid of a host process (from /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise ImageError(f"no Uid line for pid {pid}")


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageError(f"`mount {' '.join(args)}` failed (it needs root): {done.stderr.strip()}")


@contextlib.contextmanager
def container(image: str) -> Iterator[Container]:
    """A container of `image` with a read-only root: buildah's mount of it bound onto itself read-only, so a
    write anywhere but a mounted tmpfs fails with EROFS, for root too. buildah run has no --read-only; what it
    needs to write when it starts (/run/.containerenv) gets a tmpfs on /run, as `podman run --read-only` mounts
    one, and the mountpoint of the /etc/hosts it binds in is made before, as a container engine makes it."""
    name = f"txnwatch-{uuid.uuid4().hex[:10]}"
    ctr = buildah("from", "--pull-never", "--name", name, image)
    mounts: list[Path] = []
    try:
        rootfs = Path(buildah("mount", ctr))
        (rootfs / "etc" / "hosts").touch()
        _mount("--bind", str(rootfs), str(rootfs))
        mounts.append(rootfs)
        _mount("-o", "remount,bind,ro", str(rootfs))
        _mount("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", str(rootfs / "run"))
        mounts.append(rootfs / "run")
        yield Container(ctr, rootfs)
    finally:
        for mount in reversed(mounts):
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True, check=False)
        subprocess.run(buildah_cmd("umount", ctr), capture_output=True, check=False)
        subprocess.run(buildah_cmd("rm", ctr), capture_output=True, check=False)


def release_store() -> None:
    """Working containers removed and the store's own mounts (overlay mounts its layer directory) undone, so
    `rm -rf .cache` (make clean) can delete it."""
    if shutil.which("buildah") is not None and STORE.exists():
        subprocess.run(buildah_cmd("rm", "--all"), capture_output=True, check=False)
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for path in sorted((m for m in mounted if m.startswith(str(STORE) + "/")), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", path], capture_output=True, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.image", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the targets that are not built for the current inputs")
    b.add_argument("targets", nargs="*", metavar="TARGET", help=f"{' and '.join(TARGETS)} (default: both)")
    sub.add_parser("sizes", help="the built images' sizes")
    sub.add_parser("release", help="remove working containers and unmount the store (before rm -rf .cache)")
    args = parser.parse_args(argv)
    try:
        if unknown := set(getattr(args, "targets", [])) - set(TARGETS):
            raise ImageError(f"no such target: {', '.join(sorted(unknown))} (known: {', '.join(TARGETS)})")
        if args.command == "build":
            for built in build(args.targets or TARGETS):
                state = "up to date" if built.cached else f"built in {built.seconds:.0f} s"
                print(f"{built.name}  {built.size_bytes / 1e6:.0f} MB  ({state})")
        elif args.command == "release":
            release_store()
        else:
            for target in TARGETS:
                name = image_name(target)
                print(
                    f"{name}  {image_size(name) / 1e6:.0f} MB" if image_exists(name) else f"{name}  not built"
                )
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
