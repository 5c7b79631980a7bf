"""Built-in environments, one module each. Importing this package registers them."""

from env_workers.envs import calc, math  # noqa: F401
