"""Benchmarks for microbatch: each workload against the one-shot Polars limit.

Run ``python -m benchmarks [WORKLOAD ...] [--quick] [--out DIR]``; see
:mod:`benchmarks.__main__`.
"""
