"""What the tests share that is no test: valid hostile inputs, own-data files, runs, systemd."""
