"""The Nexmark queries, each as this engine's Python API, optionally its SQL, and a
one-shot Polars oracle over all events.

The SQL of the reference is nexmark/nexmark's
``nexmark-flink/src/main/resources/queries/q*.sql`` (commit 6b3646c): the
watermark is ``dateTime - 4 s`` on every stream, as its ``ddl_gen.sql``
declares. Each :class:`Query` states how it maps onto this engine where the
mapping is not one to one (``note``), and every output is compared with its
oracle over the same events: the streaming run is started with
``flush_at_end=True``, so that, as Flink does at the end of bounded input,
every window is emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Literal

import polars as pl

import microbatch as mb
from benchmarks.nexmark.generator import AUCTION, BID, PERSON, NexmarkConfig

Streams = Mapping[str, Callable[[], mb.Stream]]
"""A fresh stream per input name (``person``, ``auction``, ``bid``): a self-join
reads its source twice."""
Frames = Mapping[str, pl.LazyFrame]
"""Every event of each input, for the oracle."""

WATERMARK_DELAY = "4s"
TEN_S = 10_000
MS = pl.Datetime("ms", "UTC")


@dataclass(frozen=True)
class Query:
    """One Nexmark query: its inputs, its stream, its oracle and how output is compared."""

    name: str
    title: str
    inputs: tuple[str, ...]
    build: Callable[[Streams, NexmarkConfig], mb.Stream]
    oracle: Callable[[Frames, NexmarkConfig], pl.LazyFrame]
    output_mode: Literal["append", "update"] = "append"
    sql: Callable[[NexmarkConfig], str] | None = None
    """The query in ``mb.sql`` over tables ``person``, ``auction``, ``bid``."""
    processing_time: bool = False
    """The SQL form's ``bid`` table carries ``p_time``, the batch's processing time
    (Flink's ``PROCTIME()`` view in q12)."""
    note: str = ""
    """How the query maps onto this engine, where it is not the reference's SQL."""
    compare: Callable[[pl.DataFrame, pl.DataFrame], str | None] | None = None
    """A custom check (output, oracle) -> a difference or None; default: equal as
    multisets of rows."""
    keys: tuple[str, ...] = field(default_factory=tuple)
    """For an updating result: its key (the last row emitted per key is the result)."""

    def source_for_sql(self, name: str, make: Callable[[], mb.Stream]) -> mb.Stream:
        """The stream registered as table ``name`` for :attr:`sql`."""
        if self.processing_time:
            return make().with_processing_time("p_time")
        return make().with_watermark("dateTime", WATERMARK_DELAY)


def _bids(s: Streams) -> mb.Stream:
    return s[BID]().with_watermark("dateTime", WATERMARK_DELAY)


def _window(lf: pl.LazyFrame, size_ms: int, slide_ms: int | None = None) -> pl.LazyFrame:
    """Rows exploded over their windows' starts (tumbling when ``slide_ms`` is None)."""
    slide = slide_ms or size_ms
    t = pl.col("dateTime").cast(pl.Int64)
    last = t - t.mod(slide)
    starts = pl.int_ranges(last - (size_ms - slide), last + 1, slide) if slide_ms else (
        pl.concat_list(last))
    return (lf.with_columns(starts.alias("ws")).explode("ws")
            .filter(pl.col("ws") + size_ms > t)
            .with_columns(window_start=pl.col("ws").cast(MS),
                          window_end=(pl.col("ws") + size_ms).cast(MS)).drop("ws"))


# --------------------------------------------------------------------------- q0-q2


def q0(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    return _bids(s).select("auction", "bidder", "price", "dateTime", "extra")


def q0_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    return f[BID].select("auction", "bidder", "price", "dateTime", "extra")


EURO = pl.col("price") * pl.lit(Decimal("0.908"))
"""Dollars to euros, exact: a decimal with 3 places, as Flink's ``DECIMAL(23, 3)``."""


def q1(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    return _bids(s).select("auction", "bidder", EURO.alias("price"), "dateTime", "extra")


def q1_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    return f[BID].select("auction", "bidder", EURO.alias("price"), "dateTime", "extra")


def q2(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    return _bids(s).filter(pl.col("auction") % 123 == 0).select("auction", "price")


def q2_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    return f[BID].filter(pl.col("auction") % 123 == 0).select("auction", "price")


# --------------------------------------------------------------------------- q3, q4

Q3_STATES = ("OR", "ID", "CA")


def q3(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    back, ahead = cfg.person_reach_ms()
    auctions = (s[AUCTION]().with_watermark("dateTime", WATERMARK_DELAY)
                .filter(pl.col("category") == 10).select("id", "seller", "dateTime"))
    persons = (s[PERSON]().with_watermark("dateTime", WATERMARK_DELAY)
               .filter(pl.col("state").is_in(Q3_STATES))
               .select(pl.col("id").alias("seller"), "name", "city", "state", "dateTime"))
    joined = auctions.join_interval(persons, on="seller", left_time="dateTime",
                                    lower=-back / 1000, upper=ahead / 1000)
    return joined.select("name", "city", "state", "id")


def q3_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    a = f[AUCTION].filter(pl.col("category") == 10)
    p = f[PERSON].filter(pl.col("state").is_in(Q3_STATES))
    return a.join(p, left_on="seller", right_on="id", suffix="_p").select(
        "name", "city", "state", "id")


def q4(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    auctions = (s[AUCTION]().with_watermark("dateTime", WATERMARK_DELAY)
                .select("id", "category", "dateTime", "expires"))
    bids = _bids(s).select(pl.col("auction").alias("id"), "price",
                           pl.col("dateTime").alias("bid_time"))
    longest = cfg.auction_length_max_ms() / 1000
    joined = (auctions.join_interval(bids, on="id", left_time="dateTime", right_time="bid_time",
                                     lower=0, upper=longest)
              .filter(pl.col("bid_time") <= pl.col("expires")))
    # NOTE: an auction's winning bid is final once it expires. A joined row's
    # `expires` is at least its bid's time, and no auction expires more than
    # `longest` after the newest event, so with that delay no row is late, and a
    # 1 ms window on `expires` (one window per auction) emits each auction's
    # final price once. The running mean per category over final prices is
    # kept with transform_with_state (sum and count per category): the query
    # runs in append mode, so that the window above emits closed windows only.
    winning = (joined.with_watermark("expires", f"{longest + 4:.3f}s")
               .group_by(mb.window("expires", "1ms"), "id", "category")
               .agg(pl.col("price").max().alias("final")))
    return winning.group_by("category").transform_with_state(
        _running_mean, state_schema={"total": pl.Int64, "n": pl.Int64},
        output_schema={"category": pl.Int64, "final": pl.Float64})


def _running_mean(inp: mb.StateInput) -> mb.StateOutput:
    """Per category: add the batch's final prices to the sum and count, emit the mean."""
    new = inp.rows.group_by("category").agg(pl.col("final").sum().alias("add"),
                                            pl.len().cast(pl.Int64).alias("more"))
    state = new.join(inp.state, on="category", how="left").select(
        "category", total=pl.col("total").fill_null(0) + pl.col("add"),
        n=pl.col("n").fill_null(0) + pl.col("more"))
    rows = state.select("category", final=pl.col("total") / pl.col("n"))
    return mb.StateOutput(rows=rows, upserts=state)


def q4_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    joined = f[AUCTION].join(f[BID], left_on="id", right_on="auction", suffix="_b").filter(
        pl.col("dateTime_b").is_between(pl.col("dateTime"), pl.col("expires")))
    return (joined.group_by("id", "category").agg(pl.col("price").max().alias("final"))
            .group_by("category").agg(pl.col("final").mean().alias("final")))


# --------------------------------------------------------------------------- q5, q7, q8


def q5(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    counts = _bids(s).group_by(mb.window("dateTime", "10s", slide="2s"), "auction").agg(
        pl.len().alias("num"))
    # NOTE: in append mode every row of a window is emitted in the one batch whose
    # watermark closes it, so the maximum over a window's rows is complete within
    # that batch: Flink's join with the per-window max is a filter here.
    return counts.filter(
        pl.col("num") >= pl.col("num").max().over("window_start", "window_end")
    ).select("auction", "num", "window_start", "window_end")


def q5_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    counts = _window(f[BID], TEN_S, 2_000).group_by("window_start", "window_end", "auction").agg(
        pl.len().alias("num"))
    best = counts.group_by("window_start", "window_end").agg(pl.col("num").max().alias("maxn"))
    return counts.join(best, on=["window_start", "window_end"]).filter(
        pl.col("num") >= pl.col("maxn")).select("auction", "num", "window_start", "window_end")


def q7(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    # NOTE: a bid below its batch's highest price in its window cannot be the
    # window's highest, so each batch keeps only its per-window maxima (a filter
    # over the batch's rows); the window aggregation keyed by every bid column
    # then holds those few rows, and in append mode all rows of a window are
    # emitted in one batch, where the window's maximum is a filter again.
    ws = pl.col("dateTime").dt.truncate("10s")
    cols = ("auction", "price", "bidder", "dateTime", "extra")
    best = (_bids(s).filter(pl.col("price") == pl.col("price").max().over(ws))
            .group_by(mb.window("dateTime", "10s"), *cols).agg(pl.len().alias("n")))
    top = best.filter(pl.col("price") == pl.col("price").max().over("window_start"))
    return top.select(*cols, pl.int_ranges(0, pl.col("n")).alias("_copy")).explode(
        "_copy").drop("_copy")


def q7_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    best = _window(f[BID], TEN_S).group_by("window_end").agg(pl.col("price").max())
    bids = f[BID].select("auction", "price", "bidder", "dateTime", "extra")
    return best.join(bids, on="price").filter(
        pl.col("dateTime").is_between(pl.col("window_end") - pl.duration(seconds=10),
                                      pl.col("window_end"))
    ).select("auction", "price", "bidder", "dateTime", "extra")


def q8(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    window = mb.window("dateTime", "10s")
    persons = s[PERSON]().with_watermark("dateTime", WATERMARK_DELAY).group_by(
        window, "id", "name").agg(pl.len().alias("_p"))
    auctions = s[AUCTION]().with_watermark("dateTime", WATERMARK_DELAY).group_by(
        window, "seller").agg(pl.len().alias("_a")).rename({"seller": "id"})
    return persons.join(auctions, on=["window_start", "window_end", "id"]).select(
        "id", "name", pl.col("window_start").alias("starttime"))


def q8_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    p = _window(f[PERSON], TEN_S).group_by("window_start", "window_end", "id", "name").agg()
    a = _window(f[AUCTION], TEN_S).group_by("window_start", "window_end", "seller").agg()
    return p.join(a, left_on=["window_start", "window_end", "id"],
                  right_on=["window_start", "window_end", "seller"]).select(
        "id", "name", pl.col("window_start").alias("starttime"))


# --------------------------------------------------------------------------- q11, q12


def q11(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    return _bids(s).group_by(mb.session_window("dateTime", gap="10s"), "bidder").agg(
        pl.len().alias("bid_count")).select(
        "bidder", "bid_count", pl.col("window_start").alias("starttime"),
        pl.col("window_end").alias("endtime"))


def q11_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    t = pl.col("dateTime")
    sessions = (f[BID].select("bidder", "dateTime").sort("bidder", "dateTime")
                .with_columns(new=(t - t.shift(1).over("bidder") >= pl.duration(seconds=10))
                              .fill_null(True))
                .with_columns(session=pl.col("new").cum_sum().over("bidder")))
    return sessions.group_by("bidder", "session").agg(
        pl.len().cast(pl.UInt32).alias("bid_count"), t.min().alias("starttime"),
        (t.max() + pl.duration(seconds=10)).alias("endtime"),
    ).drop("session")


def q12(s: Streams, cfg: NexmarkConfig) -> mb.Stream:
    # NOTE: without the event-time watermark on dateTime (which q12 does not use):
    # with both, the end-of-input flush was skipped when the first batch was
    # empty, and the open processing-time windows were never emitted.
    return s[BID]().with_processing_time("p_time").group_by(
        mb.window("p_time", "10s"), "bidder").agg(pl.len().alias("bid_count")).select(
        "bidder", "bid_count", pl.col("window_start").alias("starttime"),
        pl.col("window_end").alias("endtime"))


def q12_oracle(f: Frames, cfg: NexmarkConfig) -> pl.LazyFrame:
    return f[BID].group_by("bidder").agg(pl.len().alias("bid_count"))


def q12_compare(out: pl.DataFrame, oracle: pl.DataFrame) -> str | None:
    """Processing-time windows depend on when each batch ran: the check is that the
    windows are 10 s, aligned, and their counts add up to each bidder's bids."""
    if out.height and not (out["endtime"] - out["starttime"] == timedelta(seconds=10)).all():
        return "a processing-time window is not 10 s long"
    if out.width == 0:
        return f"no output, oracle {oracle.height:,} rows"
    totals = out.group_by("bidder").agg(pl.col("bid_count").sum().cast(pl.UInt32))
    return _diff(totals, oracle.with_columns(pl.col("bid_count").cast(pl.UInt32)))


# --------------------------------------------------------------------------- SQL


def _sql(text: str) -> Callable[[NexmarkConfig], str]:
    return lambda cfg: text


Q0_SQL = "SELECT auction, bidder, price, dateTime, extra FROM bid"
Q1_SQL = "SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid"
Q2_SQL = "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"


def q3_sql(cfg: NexmarkConfig) -> str:
    """Flink's q3 with the interval bounds of :func:`q3` in the join condition."""
    back, ahead = cfg.person_reach_ms()
    return f"""
        SELECT P.name, P.city, P.state, A.id
        FROM auction AS A JOIN person AS P ON A.seller = P.id
          AND P.dateTime BETWEEN A.dateTime - INTERVAL '{int(back)}' MILLISECOND
                             AND A.dateTime + INTERVAL '{int(ahead)}' MILLISECOND
        WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"""


Q11_SQL = """
    SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, window_end AS endtime
    FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
    GROUP BY bidder, window_start, window_end"""
Q12_SQL = """
    SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, window_end AS endtime
    FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(p_time), INTERVAL '10' SECOND))
    GROUP BY bidder, window_start, window_end"""


def _diff(out: pl.DataFrame, oracle: pl.DataFrame) -> str | None:
    """None when ``out`` and ``oracle`` hold the same rows (as multisets), else why not."""
    cols = oracle.columns
    if out.width == 0:
        return f"no output, oracle {oracle.height:,} rows"
    if sorted(out.columns) != sorted(cols):
        return f"columns {out.columns} != oracle's {cols}"
    a = out.select(cols).cast(oracle.schema, strict=False).sort(cols, nulls_last=True)
    b = oracle.sort(cols, nulls_last=True)
    if a.height != b.height:
        return f"{a.height:,} rows, oracle {b.height:,}"
    if not a.equals(b):
        return f"{a.join(b, on=cols, how='anti').height:,} rows differ from the oracle's"
    return None


def check(query: Query, out: pl.DataFrame, oracle: pl.DataFrame) -> str | None:
    """None when the engine's output equals the oracle's, else the difference."""
    if query.compare is not None:
        return query.compare(out, oracle)
    return _diff(out, oracle)


QUERIES: dict[str, Query] = {q.name: q for q in (
    Query("q0", "pass through", (BID,), q0, q0_oracle, sql=_sql(Q0_SQL)),
    Query("q1", "currency conversion", (BID,), q1, q1_oracle, sql=_sql(Q1_SQL)),
    Query("q2", "selection", (BID,), q2, q2_oracle, sql=_sql(Q2_SQL)),
    Query("q3", "local item suggestion", (AUCTION, PERSON), q3, q3_oracle, sql=q3_sql,
          note="Flink's unbounded join (state forever) as an interval join whose bounds "
               "cover every person an auction can name (the generator's 1,000 active "
               "people and 10-person lead): equal to the unbounded join on this data"),
    Query("q4", "average price per category", (AUCTION, BID), q4, q4_oracle,
          keys=("category",),
          note="interval join bounded by the longest auction the generator draws; each "
               "auction's max when it expires (a 1 ms window on `expires`), then the "
               "running mean per category (transform_with_state)"),
    Query("q5", "hot items", (BID,), q5, q5_oracle,
          note="the join with the per-window max is a filter over the window's rows, all "
               "emitted in one batch (append mode)"),
    Query("q7", "highest bid", (BID,), q7, q7_oracle,
          note="each batch's per-window top bids (a filter), a window aggregation keyed by "
               "the bid's columns, then the window's top (a filter); bids of [start, end), "
               "where Flink's BETWEEN also takes a bid at exactly window_end"),
    Query("q8", "monitor new users", (PERSON, AUCTION), q8, q8_oracle,
          note="join of two tumbling-window aggregations per window"),
    Query("q11", "user sessions", (BID,), q11, q11_oracle, sql=_sql(Q11_SQL)),
    Query("q12", "processing-time windows", (BID,), q12, q12_oracle, compare=q12_compare,
          sql=_sql(Q12_SQL), processing_time=True,
          note="processing-time windows (the batch's recorded time); checked as: every "
               "window 10 s, counts per bidder add up to the one-shot count"),
)}
