"""A Docker API without Docker: podman's service, and a small sandbox image built from host files.

For tests, benchmarks and machines with no Docker engine (see PLATFORM.md):

    with PodmanService(tmp_dir) as svc:                 # `podman system service` on a unix socket
        client = docker.DockerClient(base_url=svc.url)
        image = ensure_image(client)                    # "rollout-sandbox:py311", imported once

The image holds busybox (static), the host's bash and python3.11 with the shared libraries
they load, and the python standard library: enough for the bash and python tools, ~60 MB,
built in seconds with no registry. It is cached in podman's store under a tag that names
what went in, so later runs only check that it exists.

Non-goals: running in production (point `DockerSandbox` at a real Docker engine there),
and general image building.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

IMAGE = "localhost/rollout-sandbox:py311-v1"
PYTHON = "/usr/bin/python3.11"
_BINARIES = ["/usr/bin/bash", PYTHON]
_STDLIB = "/usr/lib/python3.11"
_SKIP_STDLIB = {"test", "dist-packages", "site-packages", "idlelib", "tkinter", "turtledemo", "ensurepip"}


def missing() -> list[str]:
    """What this machine lacks to serve the Docker API with podman (empty when ready)."""
    need = {"podman": "podman", "runc": "runc", "busybox": "busybox-static"}
    out = [pkg for exe, pkg in need.items() if shutil.which(exe) is None]
    return out + [p for p in (PYTHON, "/usr/bin/bash") if not os.path.exists(p)]


class PodmanService:
    """`podman --runtime runc system service` on a socket in `folder`, stopped on exit.

    runc because crun refuses this machine's hybrid cgroups."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.socket = Path(folder) / "podman.sock"
        self.url = f"unix://{self.socket}"
        self._proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> "PodmanService":
        if lacking := missing():
            raise RuntimeError(f"cannot serve the Docker API: install {' '.join(lacking)} "
                               "(apt-get install -y --no-install-recommends podman runc busybox-static)")
        # cwd: runc/conmon drop files (an empty `oom` marker after an OOM kill) in the
        # service's working directory; keep them beside the socket, not in the caller's folder.
        self._proc = subprocess.Popen(["podman", "--runtime", "runc", "system", "service", "--time=0", self.url],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                      cwd=self.socket.parent)
        deadline = time.monotonic() + timeout_s
        while not self.socket.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"podman service exited: {self._proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("podman service did not create its socket in time")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, 9)
                self._proc.wait()
        if self._proc and self._proc.stderr:
            self._proc.stderr.close()
        self._proc = None

    def __enter__(self) -> "PodmanService":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def ensure_image(client, tag: str = IMAGE) -> str:
    """The sandbox image's tag, importing it first if the store does not have it."""
    import docker.errors

    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        build_rootfs(tar)
        # `podman import` rather than the API's image load: it takes a plain rootfs tarball.
        subprocess.run(["podman", "import", str(tar), tag], check=True, capture_output=True)
    return tag


def build_rootfs(out: Path) -> None:
    files: dict[str, str] = {}  # path in the image -> host path
    for b in _BINARIES:
        files[b] = b
    for dirpath, dirnames, filenames in os.walk(_STDLIB):
        if dirpath == _STDLIB:
            dirnames[:] = [d for d in dirnames if d not in _SKIP_STDLIB]
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in filenames:
            files[os.path.join(dirpath, f)] = os.path.join(dirpath, f)
    dynload = [p for p in files if p.endswith(".so")]
    for lib in _shared_libs(_BINARIES + dynload):
        files[_usr(lib)] = lib
    with tarfile.open(out, "w") as t:
        for d in ["usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "tmp", "workspace", "proc", "dev", "sys"]:
            _dir(t, d, 0o1777 if d in ("tmp", "workspace") else 0o755)
        for link, target in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin"),
                             ("usr/bin/python3", "python3.11"), ("usr/bin/python", "python3.11")]:
            _link(t, link, target)
        t.add("/bin/busybox", "usr/bin/busybox")
        applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
        for a in applets:
            if f"/usr/bin/{a}" not in files and a != "busybox":
                _link(t, f"usr/bin/{a}", "busybox")
        for dest, src in sorted(files.items()):
            t.add(os.path.realpath(src), dest.lstrip("/"), recursive=False)
        for name, text in [("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/workspace:/bin/sh\n"),
                           ("etc/group", "root:x:0:\nnogroup:x:65534:\n")]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text), 0o644
            t.addfile(info, io.BytesIO(text.encode()))


def _usr(path: str) -> str:
    # Merged /usr: /lib/... and /lib64/... live under /usr in the image.
    return "/usr" + path if path.startswith(("/lib/", "/lib64/")) else path


def _shared_libs(binaries: list[str]) -> set[str]:
    out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else None
        if path and path.startswith("/") and not line.endswith(":"):  # "FILE:" heads each binary's list
            libs.add(path)
    return libs


def _dir(t: tarfile.TarFile, name: str, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    t.addfile(info)


def _link(t: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    t.addfile(info)
