"""Built-in environments, one module each. Importing this package registers them."""

from env_workers.envs import calc, code, judge, math, search_qa, shop, swe, textworld  # noqa: F401
