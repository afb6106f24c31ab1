"""andrea-trainer's entry, above the loop: its command line, start, flags, preflight and the
one-command proxy; the links it serves through are in daemon/trainer/links/."""
