"""andrea-trainer's training loop and what it is built from (loop.py says which module does what).

Nothing is imported here: the entry point (service/cli.py) refuses a bad command line or config
before torch's import, which every module of the loop brings."""
