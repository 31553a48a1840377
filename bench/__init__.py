"""Benchmarks and the fuzzer, beside the product: `fleet bench ...` dispatches here.

They may import `trainer`, `telemetry` and `console`; none of those imports `bench`.
"""
