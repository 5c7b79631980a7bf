"""The one console every `rollout` command prints to."""

from rich.console import Console

console = Console()
