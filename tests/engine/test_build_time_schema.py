"""Schemas known when a query is built (issue 27, items 2 and 4).

The oracle for the derived schemas is the engine itself: for a query of every
plan-node kind, ``stream.schema`` (known before anything runs) must equal the
schema of the rows the query writes. Mistakes (a misspelled column, a wrong
event-time type, a join key missing on one side) are refused at the call that
makes them, naming the column and the closest existing ones, before a
checkpoint exists. Polars habits (named aggregations, list and ``pl.col`` keys,
``unique``, ``left_on``/``right_on``) give what their spelled-out forms give.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import microbatch as mb

START = "2026-01-01T00:00:00+00:00"
ROOT = Path(__file__).resolve().parents[2]


def payments(seed: int = 1, rows: int = 3_000) -> mb.Stream:
    return mb.generate(rows_per_second=None, total_rows=rows, cards=40, partitions=2, seed=seed,
                       start=START, max_records_per_batch=700, late_fraction=0.02,
                       late_by=("5s", "1m"))


def _running_count(inp: mb.StateInput) -> mb.StateOutput:
    counts = inp.rows.group_by("card_id").agg(pl.len().alias("n"))
    return mb.StateOutput(rows=counts, upserts=counts)


QUERIES: dict[str, tuple[Callable[[], mb.Stream], str]] = {
    "stateless": (lambda: payments().filter(pl.col("amount") > 5).with_columns(
        fee=pl.col("amount") * 0.01, day=pl.col("event_time").dt.date()), "append"),
    "processing_time": (lambda: payments().with_processing_time("proc_time")
                        .group_by(mb.window("proc_time", "1m"), "card_id")
                        .agg(n=pl.len(), total=pl.col("amount").sum()), "update"),
    "tumbling": (lambda: payments().with_watermark("event_time", "5s")
                 .group_by(mb.window("event_time", "10s"), "card_id")
                 .agg(n=pl.len(), total=pl.col("amount").sum(), mean=pl.col("amount").mean(),
                      first=pl.col("merchant").first(), last=pl.col("event_id").last(),
                      cnt=pl.col("amount").count(), lo=pl.col("amount").min()), "append"),
    "hopping_with_lateness": (lambda: payments().with_watermark("event_time", "5s")
                              .group_by(mb.window("event_time", "20s", "10s",
                                                  allowed_lateness="1m"))
                              .agg(pl.col("amount").max()), "append"),
    "session": (lambda: payments().with_watermark("event_time", "5s")
                .group_by(mb.session_window("event_time", "2s"), "card_id")
                .agg(pl.len().alias("n")), "append"),
    "keys_update": (lambda: payments().group_by("card_id", "merchant")
                    .agg(pl.col("amount").sum()), "update"),
    "fire_once": (lambda: payments().with_watermark("event_time", "5s")
                  .group_by(mb.window("event_time", "1m"), "card_id").agg(n=pl.len())
                  .fire_once(pl.col("n") >= 3, corrections=True), "append"),
    "discarding": (lambda: payments().with_watermark("event_time", "5s")
                   .group_by(mb.window("event_time", "10s"), "card_id",
                             accumulation_mode="discarding")
                   .agg(n=pl.len(), total=pl.col("amount").sum()), "append"),
    "dedupe": (lambda: payments().with_watermark("event_time", "5s")
               .drop_duplicates("card_id", within="10s"), "append"),
    "interval_join": (lambda: payments().with_watermark("event_time", "5s").join_interval(
        payments(2).select("card_id", "amount", paid_at="event_time")
        .with_watermark("paid_at", "5s"),
        on="card_id", left_time="event_time", right_time="paid_at", lower="-1s", upper="1s",
        how="left"), "append"),
    "window_join": (lambda: payments().with_watermark("event_time", "5s").join_window(
        payments(2).with_watermark("event_time", "5s"), on="card_id",
        window=mb.window("event_time", "10s")), "append"),
    "aggregate_join": (lambda: payments().with_watermark("event_time", "5s")
                       .group_by(mb.window("event_time", "10s"), "card_id").agg(n=pl.len())
                       .join(payments(2).with_watermark("event_time", "5s")
                             .group_by(mb.window("event_time", "10s"), "card_id")
                             .agg(n=pl.len()), on=["window_start", "card_id"]), "append"),
    "asof_join": (lambda: payments().with_watermark("event_time", "5s").join_asof_table(
        payments(3).select("card_id", gold=pl.col("amount") > 50, valid_from="event_time")
        .with_watermark("valid_from", "5s"),
        on="card_id", time="event_time", dim_time="valid_from"), "append"),
    "static_join": (lambda: payments().join_static(
        pl.DataFrame({"card_id": range(40), "limit": [float(i) for i in range(40)]},
                     schema_overrides={"card_id": pl.Int64}), on="card_id", how="left"),
                    "append"),
    "transform_with_state": (lambda: payments().group_by("card_id").transform_with_state(
        _running_count, state_schema={"n": pl.UInt32},
        output_schema={"card_id": pl.Int64, "n": pl.UInt32}), "update"),
}


@pytest.mark.parametrize("name", QUERIES)
def test_the_schema_known_at_build_time_is_the_schema_of_the_rows_written(
    name: str, tmp_path: Path
) -> None:
    build, mode = QUERIES[name]
    stream = build()
    declared = stream.schema
    table = f"schema-{name}"
    query = stream.write_memory(table, output_mode=mode).start(  # type: ignore[arg-type]
        tmp_path / "chk", trigger="available-now")
    assert query.await_termination(120)
    assert query.exception is None
    out = mb.table(table)
    assert out.height > 0, name
    assert out.schema == declared, name
    assert stream.collect_schema() == declared
    assert stream.columns == list(declared)


def test_the_matrix_queries_cover_every_plan_node_kind() -> None:
    from microbatch.plan.nodes import PlanNode

    def kinds(cls: type) -> set[type]:
        out = {cls}
        for sub in cls.__subclasses__():
            out |= kinds(sub)
        return out

    every = {k for k in kinds(PlanNode) if k.__module__ == "microbatch.plan.nodes"}
    every = {k for k in every if not getattr(k, "__abstractmethods__", None)}
    covered = {type(node) for build, _ in QUERIES.values() for node in build().plan.walk()}
    assert {k.__name__ for k in every - covered} == set()


# --------------------------------------------------------------- mistakes


MISTAKES: dict[str, tuple[Callable[[], object], str, list[str]]] = {
    "select": (lambda: payments().select("amout"), "select", ["'amout'", "'amount'"]),
    "filter": (lambda: payments().filter(pl.col("card") > 1), "filter", ["'card_id'"]),
    "with_columns": (lambda: payments().with_columns(x=pl.col("Amount") * 2), "with_columns",
                     ["'Amount'", "did you mean 'amount'"]),
    "watermark": (lambda: payments().with_watermark("evnt_time", "5s"), "with_watermark",
                  ["'evnt_time'", "'event_time'"]),
    "window column": (lambda: payments().with_watermark("event_time", "5s")
                      .group_by(mb.window("tss", "1m")).agg(pl.len()), "group_by window",
                      ["'tss'", "the stream has"]),
    "group_by key": (lambda: payments().group_by("card").agg(pl.len()), "group_by",
                     ["'card'", "'card_id'"]),
    "agg column": (lambda: payments().group_by("card_id").agg(pl.col("amnt").sum()), "agg",
                   ["'amnt'", "'amount'"]),
    "dedupe subset": (lambda: payments().with_watermark("event_time", "5s")
                      .drop_duplicates("eventid", within="1m"), "drop_duplicates",
                      ["'eventid'", "'event_id'"]),
    "join key, other side": (lambda: payments().with_watermark("event_time", "5s").join_interval(
        payments(2).select("amount", "event_time").with_watermark("event_time", "5s"),
        on="card_id", left_time="event_time", lower="-1s", upper="1s"),
        "join key (the other stream)", ["'card_id'"]),
    "static join key": (lambda: payments().join_static(
        pl.DataFrame({"card": [1]}), on="card_id"), "join_static key (the static table)",
        ["'card_id'", "did you mean 'card'"]),
    "fire_once condition": (lambda: payments().with_watermark("event_time", "5s")
                            .group_by(mb.window("event_time", "1m"), "card_id").agg(n=pl.len())
                            .fire_once(pl.col("count") >= 3), "fire_once condition",
                            ["'count'"]),
}


@pytest.mark.parametrize("name", MISTAKES)
def test_a_misspelled_column_is_refused_where_it_is_written(name: str) -> None:
    build, where, words = MISTAKES[name]
    with pytest.raises(mb.UnknownColumnError) as caught:
        build()
    message = str(caught.value)
    assert message.startswith(where), message
    for word in words:
        assert word in message, (word, message)


def test_an_event_time_column_of_the_wrong_type_is_refused_with_the_cast_to_use() -> None:
    with pytest.raises(mb.PlanError, match=r"with_watermark: event-time column 'merchant' has "
                       r"type String.*str\.to_datetime"):
        payments().with_watermark("merchant", "5s")
    with pytest.raises(mb.PlanError, match=r"group_by window: event-time column 'amount' has "
                       r"type Float64.*cast"):
        payments().group_by(mb.window("amount", "1m")).agg(pl.len())


def test_a_type_error_in_an_expression_is_refused_at_the_step() -> None:
    with pytest.raises(mb.PlanError, match=r"^with_columns\(.*\): arithmetic on dtypes f64 "
                       "and str"):
        payments().with_columns(x=pl.col("amount") + "a")


def test_a_query_with_a_mistake_fails_at_the_cli_before_a_checkpoint_exists(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(
        "import polars as pl\nimport microbatch as mb\n\n"
        "def build(params):\n"
        "    tx = mb.generate(rows_per_second=None, total_rows=100, seed=1)\n"
        "    return (tx.with_watermark('event_time', '5s')\n"
        "              .group_by(mb.window('event_time', '1m'), 'card').agg(n=pl.len())\n"
        "              .write_memory('x'))\n"
    )
    chk = tmp_path / "chk"
    run = subprocess.run(
        [sys.executable, "-m", "microbatch.cli", "run", str(job), "--checkpoint", str(chk),
         "--trigger", "available-now"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    output = run.stdout + run.stderr
    assert run.returncode == 2, output
    assert "column 'card' is not a column of the stream" in output
    assert "did you mean 'card_id'" in output
    assert "Traceback" not in output
    assert not chk.exists()


def test_a_stream_whose_schema_waits_for_data_says_why() -> None:
    stream = mb.read_memory(name="no-schema-yet")
    with pytest.raises(mb.PlanError, match="memory source has no declared schema; pass schema="):
        _ = stream.schema
    # checks wait for the first batch instead of refusing
    assert stream.select("anything") is not None
    typed = payments().map_batches(lambda df: df.head(1))
    with pytest.raises(mb.PlanError, match=r"map_batches\(fn, schema="):
        _ = typed.schema
    declared = payments().map_batches(lambda df: df.select("card_id"),
                                      schema={"card_id": pl.Int64})
    assert declared.schema == pl.Schema({"card_id": pl.Int64})
    with pytest.raises(mb.UnknownColumnError, match="'amount'"):
        declared.select("amount")


# ----------------------------------------------------------- Polars habits


def _run(stream: mb.Stream, tmp_path: Path, mode: str = "append") -> pl.DataFrame:
    table = f"habit-{len(list(tmp_path.iterdir()))}-{tmp_path.name}"
    chk = tmp_path / f"chk-{table}"
    query = stream.write_memory(table, output_mode=mode).start(  # type: ignore[arg-type]
        chk, trigger="available-now")
    assert query.await_termination(120)
    assert query.exception is None
    return mb.table(table)


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort(df.columns, nulls_last=True)


def test_named_aggregations_list_keys_and_col_keys_equal_the_spelled_out_query(
    tmp_path: Path,
) -> None:
    spelled = _run(payments().group_by("card_id", "merchant")
                   .agg(pl.len().alias("n"), pl.col("amount").sum().alias("total")),
                   tmp_path, "update")
    oracle = (payments_frame().group_by("card_id", "merchant")
              .agg(n=pl.len().cast(pl.Int64), total=pl.col("amount").sum()))
    # float sums: the order of additions differs from the one-shot's
    assert_frame_equal(_sorted(spelled), _sorted(oracle.select(spelled.columns)),
                       check_exact=False, rel_tol=1e-9)
    for keys in (["card_id", "merchant"], [pl.col("card_id"), "merchant"],
                 [[pl.col("card_id"), pl.col("merchant")]]):
        habit = _run(payments().group_by(*keys).agg(n=pl.len(), total=pl.col("amount").sum()),
                     tmp_path, "update")
        assert _sorted(habit).equals(_sorted(spelled)), keys


def test_window_takes_pl_col_and_refuses_a_computed_expression_with_the_fix() -> None:
    assert mb.window(pl.col("event_time"), "1m") == mb.window("event_time", "1m")
    assert mb.session_window(pl.col("t"), "1s") == mb.session_window("t", "1s")
    with pytest.raises(mb.PlanError, match=r"mb.window takes a column name or pl.col\(name\).*"
                       r"with_columns\(k="):
        mb.window(pl.col("t") + 1, "1m")
    with pytest.raises(mb.PlanError, match=r"group_by takes a column name or pl.col"):
        payments().group_by(pl.col("card_id") % 2)


def payments_frame() -> pl.DataFrame:
    """The generated rows, read whole (the oracle's input)."""
    table = f"habit-oracle-input-{next(_oracle_runs)}"
    query = payments().write_memory(table).start(trigger="available-now")
    assert query.await_termination(120)
    return mb.table(table)


_oracle_runs = itertools.count()


def test_unique_is_drop_duplicates_and_refuses_keep_last(tmp_path: Path) -> None:
    wm = payments().with_watermark("event_time", "5s")
    spelled = _run(wm.drop_duplicates(["card_id", "merchant"], within="1m"), tmp_path)
    habit = _run(wm.unique([pl.col("card_id"), "merchant"], within="1m"), tmp_path)
    assert habit.equals(spelled)
    assert habit.select("card_id", "merchant").is_duplicated().sum() < habit.height
    whole = _run(mb.read_memory(pl.DataFrame({"a": [1, 1, 2], "b": ["x", "x", "y"]}))
                 .unique(ttl="1h"), tmp_path)
    assert whole.rows() == [(1, "x"), (2, "y")]
    with pytest.raises(mb.PlanError, match=r"keep=.last..*not possible on a stream"):
        wm.unique("card_id", keep="last", within="1m")  # type: ignore[arg-type]


def test_left_on_right_on_equal_renaming_the_other_side_by_hand(tmp_path: Path) -> None:
    left = payments().with_watermark("event_time", "5s")
    right = payments(2).select(card="card_id", paid=pl.col("amount"), paid_at="event_time")
    habit = _run(left.join_interval(right.with_watermark("paid_at", "5s"), left_on="card_id",
                                    right_on="card", left_time="event_time", right_time="paid_at",
                                    lower="-1s", upper="1s"), tmp_path)
    spelled = _run(left.join_interval(right.rename({"card": "card_id"})
                                      .with_watermark("paid_at", "5s"), on="card_id",
                                      left_time="event_time", right_time="paid_at",
                                      lower="-1s", upper="1s"), tmp_path)
    assert habit.height > 0
    assert habit.equals(spelled)

    limits = pl.DataFrame({"card": range(40), "limit": [float(i) for i in range(40)]},
                          schema_overrides={"card": pl.Int64})
    path = tmp_path / "limits.parquet"
    limits.write_parquet(path)
    oracle = payments_frame().join(limits, left_on="card_id", right_on="card", how="left",
                                   maintain_order="left")
    for table in (limits, path):
        joined = _run(payments().join_static(table, left_on="card_id", right_on="card",
                                             how="left"), tmp_path)
        assert joined.columns == oracle.columns
        assert _sorted(joined).equals(_sorted(oracle)), table

    with pytest.raises(mb.PlanError, match="pass on= or left_on=/right_on=, not both"):
        payments().join_static(limits, on="card_id", left_on="card_id", right_on="card")
    with pytest.raises(mb.PlanError, match="left_on= and right_on= go together"):
        payments().join_static(limits, left_on="card_id")
    with pytest.raises(mb.UnknownColumnError, match=r"right_on.*.crd.*did you mean .card."):
        payments().join_static(limits, left_on="card_id", right_on="crd")


def test_the_update_mode_message_says_the_option_goes_on_the_writer() -> None:
    with pytest.raises(mb.PlanError, match=r"Pass output_mode='update' or 'complete' to the "
                       r"writer, e.g. \.write_delta\(path, output_mode='update'\)"):
        payments().group_by("card_id").agg(pl.len()).write_memory("never")


def test_a_build_time_error_pickles_with_its_fields() -> None:
    import pickle

    with pytest.raises(mb.UnknownColumnError) as caught:
        payments().select("amout")
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.column, again.candidates, str(again)) == (
        "amout", caught.value.candidates, str(caught.value))
    assert "amount" in again.candidates
