"""Per-rank telemetry: typed records, a loopback msgpack server, signed control, the Arrow log."""
