"""ANDREA trainer and proxy daemons and the parts they share."""
