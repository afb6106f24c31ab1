"""The trainer's links to the outside world, below the loop: its control socket (control_server),
a pivot's hold at the boundary (boundary_hold) and its client of the proxy (proxy_client)."""
