"""rollout-service: rollout-as-a-service for RL training of multi-turn LLM agents.

A trainer POSTs a batch of rollout requests to the gateway; workers run each episode
(engine + environment) and store the exact tokens, logprobs and loss masks in Redis.
"""

__version__ = "0.1.0"
