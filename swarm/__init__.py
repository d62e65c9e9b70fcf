"""Swarm RL core: servers that host and train a model, clients that feed them episodes."""
