"""The trainer's links to the outside world, below the loop: its control socket (control_server),
the pivot's hold the proxy asks for (hold_registry) and its client of the proxy (proxy_client)."""
