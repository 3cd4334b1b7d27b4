"""The workload types, kept under their old import path: they live in
:mod:`benchmarks.harness`, the one harness every entry point uses."""

from __future__ import annotations

from benchmarks.harness import Config, PhaseResults, Row, Section, SkipWorkload, Workload

__all__ = ["Config", "PhaseResults", "Row", "Section", "SkipWorkload", "Workload"]
