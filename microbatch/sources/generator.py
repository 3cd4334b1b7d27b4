"""A deterministic generator of card-transaction events, for demos and benchmarks.

Row ``i`` is a pure function of ``(seed, i, parameters)`` and of the stream's
time origin ``t0``, which is recorded in every offset: the log is generated in
fixed chunks of :data:`CHUNK_ROWS` rows, chunk ``c`` from
``np.random.default_rng([seed, c])``, fully vectorized, then sliced. So
``read(a, b)`` returns the same rows however the log is split into batches,
and a replay after a restart (the engine passes the recorded offsets back)
reproduces them exactly.

Columns: ``event_id`` (= ``i``), ``card_id`` (Zipf-skewed over ``cards`` keys,
``0`` the most frequent), ``merchant`` (``"m-0042"``), ``amount`` (lognormal,
in cents) and ``event_time``. Event ``i`` nominally happens at
``t0 + i / rows_per_second``; its ``event_time`` is that minus a uniform delay
in ``[0, max_delay]`` (bounded disorder), and a ``late_fraction`` of events
are moved back further by a uniform amount in ``late_by``.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from microbatch.durations import format_duration_ms, parse_duration_ms
from microbatch.exceptions import PlanError, SourceError
from microbatch.sources.base import Source, SourceBatch

CHUNK_ROWS = 65_536
"""Rows per generation chunk; part of the generator's definition (changing it
changes the rows)."""

GENERATOR_SCHEMA = pl.Schema(
    {
        "event_id": pl.Int64(),
        "card_id": pl.Int64(),
        "merchant": pl.String(),
        "amount": pl.Float64(),
        "event_time": pl.Datetime("ms", "UTC"),
    }
)
"""The columns of every batch the generator returns."""

_DEFAULT_EVENTS_PER_SECOND = 1000.0
_CACHED_CHUNKS = 8
_AMOUNT_MU = 3.5
_AMOUNT_SIGMA = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class _Chunk:
    """The random part of ``CHUNK_ROWS`` rows (independent of ``t0``)."""

    card: np.ndarray
    merchant: np.ndarray
    amount: np.ndarray
    shift_ms: np.ndarray
    """How far each event's time is moved back from its nominal time."""


class GeneratorSource(Source):
    """Seeded, replayable card-transaction events.

    Parameters
    ----------
    rows_per_second
        Rows become available at this rate of wall-clock time from the first
        :meth:`initial_offset`; ``None`` makes all ``total_rows`` available at
        once (event times still advance 1000 events per second).
    total_rows
        Length of the log (``None``: unbounded; required when
        ``rows_per_second`` is ``None``).
    cards, zipf
        ``card_id`` is drawn from ``cards`` keys with ``P(k) ~ 1 / (k+1)**zipf``.
    partitions
        Row ``i`` belongs to partition ``i % partitions``.
    max_delay, late_fraction, late_by
        Disorder: every event is up to ``max_delay`` behind its nominal time;
        ``late_fraction`` of them are further behind by ``late_by[0]`` to
        ``late_by[1]``.
    start
        Event-time origin: ``None``/``"now"`` for the wall clock at the first
        :meth:`initial_offset`, or a fixed ``datetime`` (naive means UTC) or
        ISO-8601 string for deterministic output.
    seed
        Seed of the whole log.
    max_records_per_batch
        Cap on rows per batch (``None``: all available rows).
    merchants
        Number of distinct merchants (uniform).
    event_rate
        Events per second of event time (default: ``rows_per_second``, or 1000
        when that is ``None``): ``event_rate=1`` with ``rows_per_second=None``
        gives hours of sparse event time available at once.

    Guarantees: ``read(a, b)`` depends only on the offsets given and the
    parameters (all part of :meth:`identity` except the batch cap), never on
    how earlier ranges were split or on the process that reads.

    Examples
    --------
    >>> src = GeneratorSource(rows_per_second=None, total_rows=10, start="2024-01-01T00:00:00Z")
    >>> start = src.initial_offset()
    >>> src.read(start, src.latest_offset(start)).data.height
    10
    """

    kind = "generator"

    def __init__(
        self,
        *,
        rows_per_second: float | None = 1000,
        total_rows: int | None = None,
        cards: int = 10_000,
        zipf: float = 1.1,
        partitions: int = 1,
        max_delay: str = "5s",
        late_fraction: float = 0.0,
        late_by: tuple[str, str] = ("1m", "1h"),
        start: datetime | str | None = None,
        seed: int = 0,
        max_records_per_batch: int | None = None,
        merchants: int = 500,
        event_rate: float | None = None,
    ) -> None:
        if event_rate is not None and not (
            isinstance(event_rate, int | float) and math.isfinite(event_rate) and event_rate > 0
        ):
            raise PlanError(
                f"generate: event_rate must be a positive number or None, got {event_rate!r}")
        if rows_per_second is not None and not (
            isinstance(rows_per_second, int | float)
            and math.isfinite(rows_per_second)
            and rows_per_second > 0
        ):
            raise PlanError(
                f"generate: rows_per_second must be a positive number or None, "
                f"got {rows_per_second!r}"
            )
        if rows_per_second is None and total_rows is None:
            raise PlanError(
                "generate: with rows_per_second=None (as fast as possible) set total_rows, "
                "or the log would be infinite and available all at once"
            )
        _check_int("total_rows", total_rows, minimum=0, optional=True)
        _check_int("cards", cards, minimum=1)
        _check_int("partitions", partitions, minimum=1)
        _check_int("merchants", merchants, minimum=1)
        _check_int("seed", seed, minimum=0)
        _check_int("max_records_per_batch", max_records_per_batch, minimum=1, optional=True)
        if not (isinstance(zipf, int | float) and math.isfinite(zipf) and zipf >= 0):
            raise PlanError(f"generate: zipf must be a number >= 0, got {zipf!r}")
        if not (isinstance(late_fraction, int | float) and 0.0 <= late_fraction <= 1.0):
            raise PlanError(f"generate: late_fraction must be in [0, 1], got {late_fraction!r}")
        late_lo = parse_duration_ms(late_by[0], what="generate: late_by[0]")
        late_hi = parse_duration_ms(late_by[1], what="generate: late_by[1]")
        if late_lo > late_hi:
            raise PlanError(f"generate: late_by must be (shortest, longest), got {late_by!r}")
        self.rows_per_second = None if rows_per_second is None else float(rows_per_second)
        self.event_rate = None if event_rate is None else float(event_rate)
        self.total_rows = total_rows
        self.cards = cards
        self.zipf = float(zipf)
        self.partitions = partitions
        self.max_delay_ms = parse_duration_ms(max_delay, what="generate: max_delay")
        self.late_fraction = float(late_fraction)
        self.late_by_ms = (late_lo, late_hi)
        self.start_ms = _start_ms(start)
        """Fixed event-time origin in epoch ms, ``None`` for the wall clock."""
        self.seed = seed
        self.max_records_per_batch = max_records_per_batch
        self.merchants = merchants

        weights = np.arange(1, cards + 1, dtype=np.float64) ** -self.zipf
        self._card_cdf = np.cumsum(weights)
        self._card_cdf /= self._card_cdf[-1]
        width = max(4, len(str(merchants - 1)))
        self._merchant_names = pl.Series([f"m-{m:0{width}d}" for m in range(merchants)])
        self._origin: dict[str, int] | None = None
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()

    # -- identity ---------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Every parameter, durations in ms and the start as ISO-8601 or ``"now"``."""
        return {**self.identity(), "max_records_per_batch": self.max_records_per_batch}

    def identity(self) -> dict[str, Any]:
        """Everything that decides the rows (all parameters but the batch cap)."""
        return {
            "kind": self.kind,
            "seed": self.seed,
            "rows_per_second": self.rows_per_second,
            "total_rows": self.total_rows,
            "cards": self.cards,
            "zipf": self.zipf,
            "partitions": self.partitions,
            "max_delay": format_duration_ms(self.max_delay_ms),
            "late_fraction": self.late_fraction,
            "late_by": [format_duration_ms(ms) for ms in self.late_by_ms],
            "start": "now" if self.start_ms is None else _iso(self.start_ms),
            "merchants": self.merchants,
            "chunk_rows": CHUNK_ROWS,
            # NOTE: only when set, so that the identity of older checkpoints still matches
            **({"event_rate": self.event_rate} if self.event_rate is not None else {}),
        }

    @property
    def schema(self) -> pl.Schema:
        """:data:`GENERATOR_SCHEMA`."""
        return GENERATOR_SCHEMA

    # -- offsets ----------------------------------------------------------------

    def initial_offset(self) -> dict[str, int]:
        """``{"rows": 0, "start_ms": t0, "wall_ms": w}``, fixed at the first call.

        ``t0`` is the event-time origin, ``w`` the wall clock from which rows
        become available; both travel in every later offset.
        """
        if self._origin is None:
            wall = _now_ms()
            t0 = wall if self.start_ms is None else self.start_ms
            self._origin = {"start_ms": t0, "wall_ms": wall}
        return {"rows": 0, **self._origin}

    def latest_offset(self, start: Any, *, capped: bool = True) -> dict[str, int]:
        """Rows available now (rate-limited by wall clock), capped per batch."""
        begin = self._check_offset(start)
        if self.rows_per_second is None:
            available = self.total_rows or 0
        else:
            elapsed_ms = max(0, _now_ms() - begin["wall_ms"])
            available = math.floor(elapsed_ms / 1000 * self.rows_per_second)
            if self.total_rows is not None:
                available = min(available, self.total_rows)
        end = max(available, begin["rows"])
        if capped and self.max_records_per_batch is not None:
            end = min(end, begin["rows"] + self.max_records_per_batch)
        return {**begin, "rows": end}

    def compare(self, a: Any, b: Any) -> int:
        """Compare row counts (offsets of the same origin)."""
        x, y = self._check_offset(a)["rows"], self._check_offset(b)["rows"]
        return (x > y) - (x < y)

    # -- reading ----------------------------------------------------------------

    def read(self, start: Any, end: Any) -> SourceBatch:
        """Rows ``[start["rows"], end["rows"])`` at the origin recorded in ``start``."""
        begin, stop = self._check_offset(start), self._check_offset(end)
        if begin["start_ms"] != stop["start_ms"]:
            raise SourceError(
                f"generator: offsets {start!r} and {end!r} have different origins (start_ms); "
                "they do not come from the same query"
            )
        a, b = begin["rows"], stop["rows"]
        if b < a or (self.total_rows is not None and b > self.total_rows):
            raise SourceError(
                f"generator: cannot read rows [{a}, {b}) of a log of "
                f"{self.total_rows if self.total_rows is not None else 'unbounded'} rows"
            )
        data = self.rows(a, b, origin_ms=begin["start_ms"])
        ids = data.get_column("event_id").to_numpy()
        partitions = pl.Series("partition", (ids % self.partitions).astype(np.int32))
        return SourceBatch(data=data, partitions=partitions)

    def rows(self, a: int, b: int, *, origin_ms: int) -> pl.DataFrame:
        """Rows ``[a, b)`` of the log whose event-time origin is ``origin_ms``."""
        cards, merchants, amounts, shifts = [], [], [], []
        if b > a:
            for c in range(a // CHUNK_ROWS, (b - 1) // CHUNK_ROWS + 1):
                chunk = self._chunk(c)
                lo = max(a, c * CHUNK_ROWS) - c * CHUNK_ROWS
                hi = min(b, (c + 1) * CHUNK_ROWS) - c * CHUNK_ROWS
                cards.append(chunk.card[lo:hi])
                merchants.append(chunk.merchant[lo:hi])
                amounts.append(chunk.amount[lo:hi])
                shifts.append(chunk.shift_ms[lo:hi])
        ids = np.arange(a, max(a, b), dtype=np.int64)
        nominal = origin_ms + self.nominal_offset_ms(ids)
        event_ms = nominal - (np.concatenate(shifts) if shifts else np.empty(0, np.int64))
        return pl.DataFrame(
            {
                "event_id": ids,
                "card_id": np.concatenate(cards) if cards else np.empty(0, np.int64),
                "merchant": self._merchant_names.gather(
                    np.concatenate(merchants) if merchants else np.empty(0, np.int64)
                ),
                "amount": np.concatenate(amounts) if amounts else np.empty(0, np.float64),
                "event_time": pl.Series(event_ms, dtype=pl.Int64).cast(pl.Datetime("ms", "UTC")),
            },
            schema=GENERATOR_SCHEMA,
        )

    def nominal_offset_ms(self, ids: np.ndarray) -> np.ndarray:
        """Milliseconds from the origin to the nominal time of events ``ids``."""
        per_second = self.event_rate or self.rows_per_second or _DEFAULT_EVENTS_PER_SECOND
        return np.floor(ids * 1000.0 / per_second).astype(np.int64)

    def _chunk(self, index: int) -> _Chunk:
        """Chunk ``index``: every array drawn in a fixed order from its own RNG."""
        cached = self._chunks.get(index)
        if cached is not None:
            self._chunks.move_to_end(index)
            return cached
        rng = np.random.default_rng([self.seed, index])
        n = CHUNK_ROWS
        card = np.searchsorted(self._card_cdf, rng.random(n), side="right")
        merchant = rng.integers(0, self.merchants, n, dtype=np.int64)
        amount = np.round(rng.lognormal(_AMOUNT_MU, _AMOUNT_SIGMA, n), 2)
        delay = rng.integers(0, self.max_delay_ms, n, dtype=np.int64, endpoint=True)
        late = rng.random(n) < self.late_fraction
        lo, hi = self.late_by_ms
        late_shift = rng.integers(lo, hi, n, dtype=np.int64, endpoint=True)
        chunk = _Chunk(
            card=np.minimum(card, self.cards - 1).astype(np.int64),
            merchant=merchant,
            amount=amount,
            shift_ms=delay + np.where(late, late_shift, 0),
        )
        self._chunks[index] = chunk
        if len(self._chunks) > _CACHED_CHUNKS:
            self._chunks.popitem(last=False)
        return chunk

    def _check_offset(self, offset: Any) -> dict[str, int]:
        keys = ("rows", "start_ms", "wall_ms")
        if not (
            isinstance(offset, dict)
            and all(isinstance(offset.get(k), int) for k in keys)
            and offset["rows"] >= 0
        ):
            raise SourceError(
                f"generator: {offset!r} is not a generator offset "
                '({"rows": n, "start_ms": t0, "wall_ms": w}); was the checkpoint written by '
                "another kind of source?"
            )
        return {k: offset[k] for k in keys}


def _check_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        allowed = " or None" if optional else ""
        raise PlanError(f"generate: {name} must be an integer >= {minimum}{allowed}, got {value!r}")


def _start_ms(start: datetime | str | None) -> int | None:
    if start is None or (isinstance(start, str) and start.strip().lower() == "now"):
        return None
    if isinstance(start, str):
        try:
            start = datetime.fromisoformat(start.strip())
        except ValueError as exc:
            raise PlanError(
                f"generate: start must be 'now', a datetime or an ISO-8601 string, got {start!r}"
            ) from exc
    if not isinstance(start, datetime):
        raise PlanError(f"generate: start must be 'now', a datetime or None, got {start!r}")
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return (start - _EPOCH) // timedelta(milliseconds=1)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
