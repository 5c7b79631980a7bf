"""HTTP routes: thin adapters from requests to the queue, store and registry."""
