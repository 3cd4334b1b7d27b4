"""Streaming SQL: Flink SQL's dialect for windows and watermarks onto the engine's plan.

``dialect``: the sqlglot dialect; ``parse``: text to trees with errors at line
and column; ``translate``: a SELECT to a ``Stream``; ``context``:
``mb.SQLContext`` and ``mb.sql``.
"""
