"""What both daemons share while they run: operator requests, systemd, logging, exit codes."""
