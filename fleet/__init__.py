"""The `fleet` command line: a thin dispatcher over the trainer, telemetry and console packages."""
