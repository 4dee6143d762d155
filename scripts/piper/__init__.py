"""Piper (instance/piper): tiny voices for the tests and the reference server for benchmarks."""
