"""Local developer tooling, not the serving path: what a laptop, a CI runner or a GPU-less
machine needs to run the service for real.

    vllm_local   a CPU vLLM: venv builder, model conversion, a tiny model, process control
                 (`rollout engine prepare|serve`, `rollout up --engine vllm`)
    podman       a Docker API without Docker (podman's service) and a small sandbox image, for
                 the docker sandbox backend's tests and benchmarks

Nothing in the gateway, workers or env workers imports these at serving time.
"""
