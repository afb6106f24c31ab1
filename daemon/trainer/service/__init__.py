"""andrea-trainer as a service: its command line, start, preflight, control socket and proxy client."""
