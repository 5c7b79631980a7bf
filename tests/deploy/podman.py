"""The platform half of the compose test: run deploy/docker-compose.yml for real through
podman's Docker API on a machine with no Docker engine and no container registry.

Everything here works around the machine, not the project (`deploy/` stays as an operator
uses it with Docker):
- `podman system service` with runc (crun refuses hybrid cgroups), lower default ulimits
  (root cannot raise the hard nofile limit here) and the netavark network backend: with CNI,
  podman 4.3 turns DNS off on an internal network, and the services find each other by name.
  `DOCKER_HOST` points Compose at it.
- No registry: stand-ins for the base images, a Debian `debootstrap --variant=minbase` tree
  from the machine's own Debian mirror, with python3 (for our image) or redis-server added,
  imported with `podman import`. Passed to the project through its own knobs
  (`PYTHON_IMAGE` build argument, `REDIS_IMAGE`), not under the official names.
- No index inside a build (TLS is intercepted and a container does not trust that CA):
  wheels are downloaded on the host, pinned by constraints.txt, and our image is built with
  `--network none` from that wheelhouse (the Dockerfile's air-gapped path).
- podman 4.3 runs HEALTHCHECKs from systemd timers and there is no systemd: `HealthRunner`
  runs them through the libpod API every few seconds.
- Network: the override file makes the stack's default network internal (no route out).
  podman publishes no port from an internal network, so the gateway alone also joins a
  second one, created here beforehand (`WalledNetwork`) with a firewall rule that drops
  whatever it would forward off its bridge: the published port (127.0.0.1 only) still
  answers, nothing inside gets out. The rule sits in the mangle table, out of reach of the
  filter-table FORWARD rules netavark manages itself (whatever order it puts them in).
- "Out" is tested without leaving the machine: `Outside` is a host in a network namespace
  behind a veth pair, with a TCP listener; reaching it from a container takes a forward off
  the bridge, exactly what the wall must stop (never a probe of a real remote host).

Cached under $ROLLOUT_CACHE_DIR/deploy-test (default ~/.cache/rollout-service/deploy-test):
the base image tarballs and the wheelhouse, keyed by what they were built from.

Non-goals: Docker itself, registries, rootless podman.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

# Stand-ins for the official images, by the packages they need. Bump the suffix to rebuild.
STANDINS = {
    "python": ("python3 python3-venv python-is-python3", "rs-standin-python:bookworm-1"),
    "redis": ("redis-server", "rs-standin-redis:bookworm-1"),
}
CONTAINERS_CONF = """\
[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[network]
network_backend = "netavark"
"""
# The stack's own network has no route out; only the gateway also joins `published` (a
# WalledNetwork), whose port is bound to 127.0.0.1 (GATEWAY_PORT).
OVERRIDE = """\
networks:
  default: { internal: true }
  published: { external: true, name: "${PUBLISHED_NETWORK}" }
services:
  gateway:
    networks: [default, published]
"""


def cache_dir() -> Path:
    base = os.environ.get("ROLLOUT_CACHE_DIR") or Path.home() / ".cache" / "rollout-service"
    d = Path(base) / "deploy-test"
    d.mkdir(parents=True, exist_ok=True)
    return d


def missing_tools() -> list[str]:
    need = ["podman", "runc", "debootstrap", "docker-compose", "netavark", "aardvark-dns", "iptables", "ip"]
    out = [t for t in need if not any(Path(d, t).exists() for d in ("/usr/sbin", "/usr/lib/podman")) and not shutil.which(t)]
    if os.geteuid() != 0:
        out.append("root (rootful podman, debootstrap)")
    return out


def sh(*cmd: str, timeout: float = 600, **kw) -> str:
    """Run a command; fail with its output."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


# ---- inputs: the Debian mirror, stand-in base images, the wheelhouse ----

def debian_mirror() -> tuple[str, str]:
    """(mirror URL, suite) of the machine's own apt sources."""
    suite = re.search(r"^VERSION_CODENAME=(\w+)", Path("/etc/os-release").read_text(), re.M).group(1)
    texts = [p.read_text() for p in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
             if p.is_file() and p.suffix in (".list", ".sources")]
    for text in texts:
        for m in re.finditer(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s*)?)(\S+)", text, re.M):
            url = m.group(1)
            if "security" not in url and not url.startswith("cdrom"):
                return url, suite
    raise RuntimeError("no Debian mirror in /etc/apt/sources.list*")


def standin_images(env: dict[str, str]) -> dict[str, str]:
    """Make sure each stand-in base image is in podman's store, imported from its cached
    tarball (built first if missing: ~2 min for both). Returns kind -> image name."""
    out = {}
    for kind, (packages, tag) in STANDINS.items():
        out[kind] = f"localhost/{tag}"
        if subprocess.run(["podman", "image", "exists", out[kind]], env=env).returncode != 0:
            changes = ["WORKDIR /data", 'CMD ["redis-server"]'] if kind == "redis" else ['CMD ["python3"]']
            sh("podman", "import", *[a for c in changes for a in ("--change", c)], str(standin_tarball(tag, packages)),
               out[kind], env=env)
    shutil.rmtree(cache_dir() / "rootfs", ignore_errors=True)
    return out


def standin_tarball(tag: str, packages: str) -> Path:
    """A Debian minbase tree (debootstrap'ed once, shared by the stand-ins) plus `packages`,
    as a tarball in the cache."""
    tarball = cache_dir() / f"{tag.replace(':', '-')}.tar"
    if tarball.exists():
        return tarball
    base, tree = cache_dir() / "rootfs/minbase", cache_dir() / "rootfs" / tag
    if not (base / "usr/bin/apt-get").exists():
        shutil.rmtree(base, ignore_errors=True)
        mirror, suite = debian_mirror()
        sh("debootstrap", "--variant=minbase", suite, str(base), mirror, timeout=900)
    shutil.rmtree(tree, ignore_errors=True)
    sh("cp", "-a", str(base), str(tree))
    (tree / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")  # start no service in the chroot
    (tree / "usr/sbin/policy-rc.d").chmod(0o755)
    shutil.copy("/etc/resolv.conf", tree / "etc/resolv.conf")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive"}
    sh("chroot", str(tree), "apt-get", "update", "-qq", env=env)
    sh("chroot", str(tree), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages.split(),
       env=env, timeout=900)
    sh("chroot", str(tree), "apt-get", "clean", env=env)
    for f in (tree / "var/lib/apt/lists").glob("*"):  # the package lists: 40 MB no image needs
        if f.is_file():
            f.unlink()
    for f in ("usr/sbin/policy-rc.d", "etc/resolv.conf"):
        (tree / f).unlink()
    (tree / "data").mkdir(exist_ok=True)
    sh("tar", "-C", str(tree), "-cf", f"{tarball}.part", ".")
    os.replace(f"{tarball}.part", tarball)
    shutil.rmtree(tree)
    return tarball


def wheelhouse(extras: str = "server") -> Path:
    """Wheels for `.[extras]` pinned by constraints.txt, downloaded on the host once per
    (constraints, pyproject) and kept. Adds setuptools (the build backend: pip builds the
    project inside the image with no index) and async-timeout (redis needs it on Debian's
    Python 3.11.2)."""
    key = hashlib.sha256((ROOT / "constraints.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
                         + extras.encode()).hexdigest()[:12]
    d = cache_dir() / f"wheels-{key}"
    if (d / ".complete").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    sh("python", "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(d), "-c", "constraints.txt",
       "setuptools", "async-timeout", f".[{extras}]", cwd=ROOT, timeout=900)
    (d / ".complete").touch()
    return d


# ---- the API service, Compose, and the health-check runner ----

@dataclass
class Podman:
    """`podman system service` on a socket of our own, and what Compose needs to use it."""
    workdir: Path
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.workdir / "podman.sock"

    def start(self) -> "Podman":
        conf = self.workdir / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf), "DOCKER_HOST": f"unix://{self.socket}"}
        self.env = {k: v for k, v in self.env.items() if not k.startswith(("ROLLOUT_", "COMPOSE_"))}
        self.proc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{self.socket}"],
                                     env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "podman-service.log", "wb"))
        deadline = time.monotonic() + 30
        while not self.socket.exists() or not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("podman service did not start:\n"
                                   + (self.workdir / "podman-service.log").read_text()[-2000:])
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def api(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://d", timeout=60)

    def ping(self) -> bool:
        try:
            with self.api() as c:
                return c.get("/_ping").status_code == 200
        except httpx.HTTPError:
            return False


@dataclass
class WalledNetwork:
    """A bridge network that can publish ports but forwards nothing off its bridge: a
    FORWARD rule drops packets coming in from it and going out elsewhere, inserted before
    the first container joins and removed with the network."""
    podman: Podman
    name: str
    bridge: str = ""

    def rule(self, op: str) -> list[str]:
        return ["iptables", "-t", "mangle", op, "FORWARD", "-i", self.bridge, "!", "-o", self.bridge, "-j", "DROP"]

    def __enter__(self) -> "WalledNetwork":
        sh("podman", "network", "create", self.name, env=self.podman.env)
        self.bridge = json.loads(sh("podman", "network", "inspect", self.name, env=self.podman.env))[0]["network_interface"]
        sh(*self.rule("-I"))
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(self.rule("-D"), capture_output=True)
        subprocess.run(["podman", "network", "rm", "-f", self.name], env=self.podman.env, capture_output=True)


_LISTENER = """
import socket, sys
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    c, _ = s.accept()
    c.sendall(b"out")
    c.close()
"""


@dataclass
class Outside:
    """A host off this machine's bridges without leaving the machine: a network namespace on a
    veth pair (`host_ip` on our side, `ip` on its side) with a TCP listener on `port`."""
    name: str
    host_ip: str = "10.254.77.1"
    ip: str = "10.254.77.2"
    port: int = 8099
    proc: subprocess.Popen | None = None

    def __enter__(self) -> "Outside":
        ns, veth, peer = self.name, f"{self.name[:10]}h", f"{self.name[:10]}o"
        sh("ip", "netns", "add", ns)
        try:
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", ns)
            sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", veth)
            sh("ip", "link", "set", veth, "up")
            for cmd in (("ip", "addr", "add", f"{self.ip}/30", "dev", peer), ("ip", "link", "set", peer, "up"),
                        ("ip", "link", "set", "lo", "up"), ("ip", "route", "add", "default", "via", self.host_ip)):
                sh("ip", "netns", "exec", ns, *cmd)
            self.proc = subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", _LISTENER, str(self.port)])
            deadline = time.monotonic() + 20
            while not self.reachable():  # from the host itself: the listener is up, the route works
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the outside host {self.ip}:{self.port} never answered the host")
                time.sleep(0.2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def reachable(self) -> bool:
        import socket
        try:
            with socket.create_connection((self.ip, self.port), timeout=2) as c:
                return c.recv(3) == b"out"
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)  # takes the veth pair with it


@dataclass
class Compose:
    """One Compose project (its own name) of deploy/docker-compose.yml plus our override."""
    podman: Podman
    project: str
    env: dict[str, str]
    override: Path
    url: str = ""  # the gateway, as published on 127.0.0.1
    batches: list[tuple[str, int]] = field(default_factory=list)  # (batch id, trajectories) submitted so far

    def __call__(self, *args: str, timeout: float = 300) -> str:
        cmd = ["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), "-f", str(self.override),
               "-p", self.project, *args]
        try:
            return sh(*cmd, env={**self.podman.env, **self.env}, timeout=timeout)
        except RuntimeError as e:
            if args[0] != "up":
                raise
            logs = subprocess.run([*cmd[:cmd.index("-p") + 2], "logs", "--no-color", "--tail", "30"], text=True,
                                  env={**self.podman.env, **self.env}, capture_output=True, timeout=60).stdout
            raise RuntimeError(f"{e}\n---- the services' last logs ----\n{logs[-6000:]}") from None

    def containers(self, all: bool = True) -> list[dict]:
        """This project's containers, as the Docker API lists them."""
        flt = json.dumps({"label": [f"com.docker.compose.project={self.project}"]})
        with self.podman.api() as c:
            return c.get("/containers/json", params={"all": str(all).lower(), "filters": flt}).json()

    def volumes(self) -> list[dict]:
        flt = json.dumps({"label": [f"com.docker.compose.project={self.project}"]})
        with self.podman.api() as c:
            vols = c.get("/volumes", params={"filters": flt}).json().get("Volumes") or []
            named = c.get("/volumes").json().get("Volumes") or []
        return vols + [v for v in named if v["Name"].startswith(f"{self.project}_") and v not in vols]

    def inspect(self, cid: str) -> dict:
        with self.podman.api() as c:
            return c.get(f"/containers/{cid}/json").json()

    def of(self, service: str) -> list[dict]:
        """Inspect output of a service's containers, by replica number."""
        cs = [self.inspect(c["Id"]) for c in self.containers()
              if c["Labels"].get("com.docker.compose.service") == service]
        return sorted(cs, key=lambda c: int(c["Config"]["Labels"].get("com.docker.compose.container-number", 0)))

    def memory(self, cid: str) -> int:
        """Bytes of memory a container uses now (its cgroup's usage, less page cache when given)."""
        with self.podman.api() as c:
            m = c.get(f"/containers/{cid}/stats", params={"stream": "false"}).json().get("memory_stats", {})
        return int(m.get("usage", 0)) - int(m.get("stats", {}).get("cache", 0) or 0)


class HealthRunner:
    """Stands in for the systemd timers podman 4.3 runs HEALTHCHECKs from: runs every running
    container's check of one project through the libpod API, every `every` seconds."""

    def __init__(self, compose: Compose, every: float = 3.0):
        self.compose, self.every = compose, every
        self.stop_ = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="health-runner")

    def run(self) -> None:
        while not self.stop_.is_set():
            try:
                with self.compose.podman.api() as c:
                    for ctr in self.compose.containers(all=False):
                        c.get(f"/v4.0.0/libpod/containers/{quote(ctr['Id'])}/healthcheck")  # runs the check
            except (httpx.HTTPError, ValueError):
                pass  # the service restarts or the project goes down: try again next round
            self.stop_.wait(self.every)

    def __enter__(self) -> "HealthRunner":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_.set()
        self.thread.join(30)
