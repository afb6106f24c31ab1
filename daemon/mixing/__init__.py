"""Data mixing: the bandit, its policy, the assignment book and the proxy daemon that runs them."""
