"""`python -m rollout_service.cli` is `rollout`."""

from rollout_service.cli import main

main()
