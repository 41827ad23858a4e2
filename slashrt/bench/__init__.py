"""Benchmark queries (YSB, RO, CM): data generators, dataflows and independent numpy references.

Each benchmark verifies its own result against a reference computed without the runtime, and
reports one dict that the CLI prints as JSON.
"""
