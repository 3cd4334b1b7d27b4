"""Stateful operators: each reads state version N and stages version N+1 per batch
(stream-stream joins per input, from its first batch: :mod:`statestore.contract`)."""
