"""Sandboxes: a protocol (`base`), two backends, `bwrap` (the default) and `docker`, and
`pool` (sandboxes as typed resources of `env_workers/resources.py`, with their tools)."""

from env_workers.sandbox.base import WORKSPACE, ExecResult, Limits, Sandbox, SandboxClosed, SandboxError, Terminal

__all__ = ["WORKSPACE", "ExecResult", "Limits", "Sandbox", "SandboxClosed", "SandboxError", "Terminal"]
