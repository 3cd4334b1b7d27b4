"""Stateful operators: each reads state version N and stages version N+1 per batch."""
