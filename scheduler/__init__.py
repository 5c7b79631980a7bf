"""The scheduler: the durable queue on Redis, trajectory states, and engine routing."""
