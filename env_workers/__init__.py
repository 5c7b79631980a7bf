"""Environment workers: environments behind an HTTP API, with a registry and a checker."""
