"""Per-rank telemetry: typed records, a loopback msgpack server, signed control, and the Arrow log."""
