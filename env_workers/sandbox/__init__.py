"""Sandboxes: a protocol (`base`) and two backends, `bwrap` (the default) and `docker`."""

from env_workers.sandbox.base import WORKSPACE, ExecResult, Limits, Sandbox, SandboxClosed, SandboxError, Terminal

__all__ = ["WORKSPACE", "ExecResult", "Limits", "Sandbox", "SandboxClosed", "SandboxError", "Terminal"]
