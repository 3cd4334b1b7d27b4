"""Power-loss crash states: record a job's file operations, replay every state
a power loss may leave, recover from each and check the result.

In the spirit of ALICE (Pillai et al., OSDI 2014) and CrashMonkey: SIGKILL
keeps the page cache, so the kill tests never see what a machine that loses
power leaves on disk. Here the job runs once with a recorder on the durable
write layer (``statestore/durable.py``: the only place that writes, renames,
unlinks or fsyncs durable files, for the checkpoint, the state stores and the
sinks alike; delta-rs's own writes are reported there by the Delta sink).
Then, for each crash point (a prefix of the recorded operations), the explorer
builds the states the persistence model below allows, writes each onto the
job's directories, restarts the job and checks it.

The persistence model (POSIX promises no more; real file systems often keep
more, e.g. ext4's ordered journal):

- a file's data persists only when the file was ``fsync``'ed after the write;
  otherwise it may be all there, empty, or torn (its first half);
- a name's create, rename or unlink, and a ``mkdir``, persist only when their
  directory was ``fsync``'ed after them; otherwise each may or may not have
  persisted, independently of the others, in any combination;
- files are inodes: a persisted rename names whatever the inode holds; a
  file whose directory's own name did not persist is gone with it;
- files another library wrote without fsync (delta-rs: a commit's data files,
  then its log entry; reported by the Delta sink with ``note_written``) persist
  as a prefix of what it wrote, each file whole: the ordering that ext4's
  default ``data=ordered`` journal gives. We do not control delta-rs's writes;
  ``strict=True`` drops this assumption and counts the states that then break
  (a log entry persisted whose data file did not, a torn log entry).

The state before the recording (the directories after the first batches) is
taken as durable. A crash point's states are all combinations when there are
at most ``per_point`` of them, else a seeded random sample of that many plus
the two extremes (everything unsynced persisted, nothing persisted).

Checks for each distinct state:

1. no state store version is ahead of the write-ahead log (version ``N+1``
   exists only when ``offsets/N`` does);
2. the restarted job either completes or refuses with the project's own error
   class naming a file (``microbatch.exceptions.USER_ERRORS``, the errors the
   CLI reports as the user's to fix); anything else
   (a Polars or Arrow error from a torn file, a crash) is a failure;
3. after a completed restart, the output equals the one-shot Polars result:
   every row once, none lost (``harness.verify``), and no state store version
   is ahead of the commit log.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))

import harness
import reliability_job

import statestore.durable
from microbatch.exceptions import USER_ERRORS

ENTRY_KINDS = ("write", "wrote", "rename", "unlink", "mkdir")
"""Operations on a directory's names (persisted by an fsync of that directory)."""
VARIANTS = ("full", "empty", "torn")
"""What an unsynced file's data may look like after a power loss."""


@dataclass(frozen=True)
class Op:
    """One recorded operation with the inode it touches."""

    index: int
    kind: str
    path: Path
    target: Path | None = None
    ino: str | None = None
    data: bytes | None = None

    @property
    def external(self) -> bool:
        """Written by another library (``wrote``), not by the durable layer."""
        return self.kind == "wrote"


@dataclass
class Trace:
    """The operations under ``roots``, in program order (a durable-layer recorder)."""

    roots: tuple[Path, ...]
    ops: list[Op] = field(default_factory=list)
    _names: dict[Path, str] = field(default_factory=dict)
    _count: Iterator[int] = field(default_factory=itertools.count)

    def __call__(self, op: tuple[str, Path, Path | None, bytes | None]) -> None:
        kind, path, target, data = op
        path = Path(path)
        tops = kind == "fsync_dir" and any(path == root.parent for root in self.roots)
        if not (self._inside(path) or tops):
            return
        index = len(self.ops)
        if kind in ("write", "wrote"):
            ino = f"i{next(self._count)}"
            self._names[path] = ino
            self.ops.append(Op(index, kind, path, ino=ino, data=data))
        elif kind == "fsync":
            self.ops.append(Op(index, kind, path, ino=self._ino(path)))
        elif kind == "rename":
            assert target is not None
            assert Path(target).parent == path.parent
            ino = self._ino(path)
            self._names.pop(path, None)
            self._names[Path(target)] = ino
            self.ops.append(Op(index, kind, path, Path(target), ino=ino))
        elif kind == "unlink":
            self._names.pop(path, None)
            self.ops.append(Op(index, kind, path))
        else:  # mkdir, fsync_dir
            self.ops.append(Op(index, kind, path))

    def _ino(self, path: Path) -> str:
        return self._names.get(path, f"base:{path}")

    def _inside(self, path: Path) -> bool:
        return any(path == root or root in path.parents for root in self.roots)

    def counts(self) -> dict[str, int]:
        """Operations per kind."""
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.kind] = out.get(op.kind, 0) + 1
        return out


@contextmanager
def recording(trace: Trace) -> Iterator[Trace]:
    """Record the durable-write layer's operations into ``trace``."""
    with statestore.durable.recording(trace):
        yield trace


# ------------------------------------------------------------------ the file tree


@dataclass(frozen=True)
class Tree:
    """Directories and files (path -> bytes) under the roots: one state of the disk."""

    dirs: frozenset[Path]
    files: tuple[tuple[Path, bytes], ...]

    def digest(self) -> str:
        """Equal for equal trees (to run each distinct state once)."""
        h = hashlib.sha256()
        for d in sorted(self.dirs):
            h.update(b"d" + str(d).encode() + b"\0")
        for path, data in self.files:
            h.update(b"f" + str(path).encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()

    def write(self, roots: tuple[Path, ...]) -> None:
        """Make the directories ``roots`` hold exactly this tree."""
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
        for d in sorted(self.dirs, key=lambda p: len(p.parts)):
            d.mkdir(exist_ok=True)
        for path, data in self.files:
            path.write_bytes(data)


def snapshot(roots: tuple[Path, ...]) -> Tree:
    """The tree on disk now."""
    dirs, files = set(), []
    for root in roots:
        if not root.is_dir():
            continue
        dirs.add(root)
        for path in sorted(root.rglob("*")):
            if DATABASE_DIR in path.relative_to(root).parts:
                continue  # the disk backend's database: not written through the layer
            if path.is_dir():
                dirs.add(path)
            elif path.is_file():
                files.append((path, path.read_bytes()))
    return Tree(frozenset(dirs), tuple(sorted(files)))


# ------------------------------------------------------------------ crash states


@dataclass(frozen=True)
class CrashState:
    """One crash point and one choice of what its unsynced operations left."""

    point: int
    persisted: frozenset[int]
    """Indexes of unsynced name operations that persisted."""
    variants: tuple[tuple[str, str], ...]
    """Unsynced inode -> ``full`` | ``empty`` | ``torn``."""
    external: int = 0
    """How many of the unsynced files another library wrote persisted (in order)."""
    strict: bool = False
    """Whether those files were treated like our own (no ordering assumed)."""

    def label(self) -> str:
        """Short description for failure messages."""
        return (f"crash after op {self.point}; unsynced names persisted: "
                f"{sorted(self.persisted)}; unsynced data: {dict(self.variants)}"
                + (f"; delta-rs files persisted: {self.external}" if self.external else ""))


@dataclass(frozen=True)
class Unsynced:
    """What a crash after a prefix of the operations may lose."""

    names: list[Op]
    """Name operations (ours) not yet made durable by a directory fsync."""
    inodes: list[str]
    """Files (ours) whose data was not fsync'ed."""
    external: list[Op]
    """Another library's writes not yet durable, name and data (ordered model)."""


def unsynced(ops: list[Op], *, strict: bool = False) -> Unsynced:
    """What a crash after ``ops`` may lose."""
    names, inodes, external = [], [], []
    for op in ops:
        later = ops[op.index + 1:]
        name_lost = op.kind in ENTRY_KINDS and not any(
            o.kind == "fsync_dir" and o.path == op.path.parent for o in later)
        data_lost = op.kind in ("write", "wrote") and not any(
            o.kind == "fsync" and o.ino == op.ino for o in later)
        if op.external and not strict:
            if name_lost or data_lost:
                external.append(op)
            continue
        if name_lost:
            names.append(op)
        if data_lost:
            inodes.append(op.ino or "")
    return Unsynced(names, inodes, external)


def crash_states(ops: list[Op], point: int, per_point: int, rng: random.Random, *,
                 strict: bool = False) -> list[CrashState]:
    """The states a crash after ``ops[:point]`` may leave (all, or a sample)."""
    lost = unsynced(ops[:point], strict=strict)
    names, inodes = lost.names, lost.inodes
    orders = list(range(len(lost.external) + 1))
    total = 2 ** len(names) * 3 ** len(inodes) * len(orders)
    combos: list[tuple[tuple[bool, ...], tuple[str, ...], int]]
    if total <= per_point:
        masks: list[tuple[bool, ...]] = list(itertools.product((True, False), repeat=len(names)))
        shapes: list[tuple[str, ...]] = list(itertools.product(VARIANTS, repeat=len(inodes)))
        combos = list(itertools.product(masks, shapes, orders))
    else:
        combos = [((True,) * len(names), ("full",) * len(inodes), orders[-1]),
                  ((False,) * len(names), ("empty",) * len(inodes), 0)]
        combos += [
            (tuple(rng.random() < 0.5 for _ in names),
             tuple(rng.choice(VARIANTS) for _ in inodes), rng.choice(orders))
            for _ in range(per_point - 2)
        ]
    return [
        CrashState(point, frozenset(op.index for op, keep in zip(names, mask, strict=True)
                                    if keep),
                   tuple(zip(inodes, shape, strict=True)), external, strict)
        for mask, shape, external in combos
    ]


def materialize(base: Tree, ops: list[Op], state: CrashState,
                tops: frozenset[Path] | None = None) -> Tree:
    """The tree ``state`` leaves: ``base`` plus the persisted part of the prefix
    (``tops``: directories that always exist; default: the parents of ``base``'s
    top directories)."""
    prefix = ops[:state.point]
    lost = unsynced(prefix, strict=state.strict)
    names_unsynced = {op.index for op in lost.names}
    external_lost = {op.index for op in lost.external[state.external:]}
    variants = dict(state.variants)
    data = {f"base:{path}": content for path, content in base.files}
    dirs = set(base.dirs)
    names = {path: f"base:{path}" for path, _ in base.files}
    for op in prefix:
        if op.index in external_lost:
            continue
        if op.kind in ("write", "wrote"):
            assert op.ino is not None
            assert op.data is not None
            shape = variants.get(op.ino, "full")
            data[op.ino] = (op.data if shape == "full" else b"" if shape == "empty"
                            else op.data[: len(op.data) // 2])
        if op.kind not in ENTRY_KINDS:
            continue
        if op.index in names_unsynced and op.index not in state.persisted:
            continue
        if op.kind in ("write", "wrote"):
            names[op.path] = op.ino or ""
        elif op.kind == "rename":
            assert op.target is not None
            assert op.ino is not None
            names.pop(op.path, None)
            names[op.target] = op.ino
        elif op.kind == "unlink":
            names.pop(op.path, None)
        else:
            dirs.add(op.path)
    if tops is None:
        tops = frozenset(d.parent for d in base.dirs if d.parent not in base.dirs)
    present = {d for d in dirs if _reachable(d, dirs, tops)}
    files = tuple(sorted((p, data.get(ino, b"")) for p, ino in names.items()
                         if p.parent in present))
    return Tree(frozenset(present), files)


def _reachable(d: Path, dirs: set[Path], tops: frozenset[Path]) -> bool:
    while d not in tops:
        if d not in dirs or d.parent == d:
            return False
        d = d.parent
    return True


# ------------------------------------------------------------------ one job path


@dataclass
class Finding:
    """A state whose recovery broke a check."""

    state: str
    problem: str


@dataclass
class Report:
    """What exploring one job path found."""

    path: str
    ops: dict[str, int]
    crash_points: int
    states: int
    distinct: int
    explored: int
    recovered: int
    refused: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0


PATHS: dict[str, harness.JobSpec] = {
    "file -> Parquet": harness.JobSpec(source="files", sink="parquet", files=8, cap=1,
                                       snapshot_every=None, state_retention=None),
    "file -> Delta": harness.JobSpec(source="files", sink="delta", files=8, cap=1,
                                     snapshot_every=None, state_retention=None),
    "file -> Iceberg": harness.JobSpec(source="files", sink="iceberg", files=8, cap=1,
                                       snapshot_every=None, state_retention=None),
    "state store snapshot + changelog": harness.JobSpec(
        source="files", agg="session", sink="parquet", files=8, cap=1, gap="3s",
        snapshot_every=2, state_retention=2),
    "pipelined: file -> Delta, sessions": harness.JobSpec(
        source="files", agg="session", sink="delta", files=8, cap=1, gap="3s",
        snapshot_every=2, state_retention=2, pipelined=True),
    "disk state store (lmdb): sessions": harness.JobSpec(
        source="files", agg="session", sink="parquet", files=8, cap=1, gap="3s",
        snapshot_every=2, state_retention=2, state_backend="lmdb"),
}
"""The job paths explored: the reliability job's files source (JSON lines with
bad lines) into a Parquet or Delta sink; the third snapshots every 2 versions
and purges beyond 2, so snapshots, changelogs and deletes all happen. The
fourth runs ``pipelined``: batch N's Delta commit and ``commits/N`` interleave
with batch N+1's write-ahead and state commit, so a crash may leave two batches
uncommitted. The fifth keeps the sessions' keyed stores in the on-disk LMDB
backend: its database is written by a C library the recorder cannot see, and it
is a cache of the Arrow files the recorder does see, so every crash state is
recovered twice over: without the database (lost: rebuilt from the files) on
even states, and with the database as the base run left it (behind the files:
rolled forward, or rebuilt when its version's file is gone) on odd ones."""

DATABASE_DIR = "lmdb"
"""The on-disk backend's database directories: outside the recorded tree."""

FROM_SCRATCH = frozenset({"first start: file -> Parquet"})
"""Paths recorded from an empty directory: the first run creates the checkpoint,
its directories and the output (every ``mkdir`` is in the recording)."""
PATHS["first start: file -> Parquet"] = harness.JobSpec(
    source="files", sink="parquet", files=2, cap=1, snapshot_every=None, state_retention=None)


@contextmanager
def state_store_defaults(spec: harness.JobSpec) -> Iterator[None]:
    """Snapshot and retention settings of ``spec`` for stores created in the block."""
    from statestore.provider import StateStoreProvider

    original = StateStoreProvider.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if spec.snapshot_every:
            kwargs.setdefault("max_changelog_chain", spec.snapshot_every)
        if spec.state_retention:
            kwargs.setdefault("retention_versions", spec.state_retention)
        original(self, *args, **kwargs)

    StateStoreProvider.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        StateStoreProvider.__init__ = original  # type: ignore[method-assign]


def run_job(spec: harness.JobSpec, work: Path) -> None:
    """Run the reliability job in this process until the input is processed."""
    params = {"output": str(work / "out"), "input": str(work / "in"), "source": spec.source,
              "agg": spec.agg, "sink": spec.sink, "cap": str(spec.cap), "window": spec.window,
              "gap": spec.gap, "delay": spec.delay}
    with state_store_defaults(spec):
        query = reliability_job.build(params).start(checkpoint=work / "chk",
                                                   trigger="available-now",
                                                   pipelined=spec.pipelined,
                                                   state_backend=spec.state_backend)
        try:
            query.await_termination()
        finally:
            query.stop()
    if query.exception is not None:
        raise query.exception


def _ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) \
        if directory.is_dir() else []


def state_versions(chk: Path) -> dict[Path, int]:
    """The newest version file of each state store under ``chk/state``."""
    out = {}
    for kind_dir in (chk / "state").rglob("changelog"):
        store = kind_dir.parent
        versions = [int(p.name.split(".")[0]) for kind in ("changelog", "snapshot")
                    if (store / kind).is_dir() for p in (store / kind).iterdir()
                    if p.name.endswith(".arrow") and p.name.split(".")[0].isdigit()]
        out[store] = max(versions, default=0)
    return out


def ahead(chk: Path, log: str) -> list[str]:
    """State stores with a version past what ``log`` (offsets or commits) allows."""
    ids = _ids(chk / log)
    limit = (ids[-1] if ids else -1) + 1
    return [f"{store.relative_to(chk)} at version {v} > {log} allows {limit}"
            for store, v in state_versions(chk).items() if v > limit]


def explore(name: str, spec: harness.JobSpec, work: Path, *, per_point: int = 16,
            max_states: int | None = None, seed: int = 1, strict: bool = False,
            last_points: int | None = None, from_scratch: bool | None = None,
            progress: Callable[[str], None] | None = None) -> Report:
    """Record ``spec``'s job over its last quarter of input and explore its crash states
    (at most ``max_states`` distinct ones, spread over the crash points; only the last
    ``last_points`` crash points when given; ``from_scratch``: record the very first
    run instead, which creates the checkpoint and the output; default: whether
    ``name`` is in :data:`FROM_SCRATCH`)."""
    if from_scratch is None:
        from_scratch = name in FROM_SCRATCH
    t0 = time.monotonic()
    soak = harness.Soak(spec, work)
    soak.prepare()  # lands 3/4 of the input
    roots = (work / "chk", work / "out", work / "out-late")
    tops = frozenset({work})
    if not from_scratch:
        run_job(spec, work)  # the durable base state
    base = snapshot(roots)
    databases = {p: p.read_bytes() for p in (work / "chk").rglob(f"{DATABASE_DIR}/*")
                 if p.is_file()}
    soak.land(spec.files)
    trace = Trace(roots)
    with recording(trace):
        run_job(spec, work)
    final = snapshot(roots)
    everything = CrashState(len(trace.ops), frozenset(op.index for op in trace.ops), (),
                            external=len(trace.ops))
    replayed = materialize(base, trace.ops, everything, tops)
    _check_complete(replayed, final)
    rng = random.Random(seed)
    states: list[CrashState] = []
    first = 0 if last_points is None else max(0, len(trace.ops) + 1 - last_points)
    for point in range(first, len(trace.ops) + 1):
        states.extend(crash_states(trace.ops, point, per_point, rng, strict=strict))
    trees: dict[str, tuple[CrashState, Tree]] = {}
    for state in states:
        tree = materialize(base, trace.ops, state, tops)
        trees.setdefault(tree.digest(), (state, tree))
    chosen = list(trees.values())
    if max_states is not None and len(chosen) > max_states:
        step = len(chosen) / max_states
        chosen = [chosen[int(i * step)] for i in range(max_states)]
    report = Report(name, trace.counts(), len(trace.ops) + 1 - first, len(states), len(trees),
                    len(chosen), 0)
    for i, (state, tree) in enumerate(chosen):
        tree.write(roots)
        if i % 2 and databases:  # the database as the base run left it, behind the files
            for path, data in databases.items():
                if path.parent.parent.is_dir():
                    path.parent.mkdir(exist_ok=True)
                    path.write_bytes(data)
        problem = check_state(spec, work)
        if problem is None:
            report.recovered += 1
        elif problem.startswith("refused: "):
            report.refused.append(f"{state.label()}: {problem}")
        else:
            report.findings.append(Finding(state.label(), problem))
        if progress and (i + 1) % 25 == 0:
            progress(f"{name}: {i + 1}/{len(chosen)} states, {len(report.findings)} findings")
    report.seconds = time.monotonic() - t0
    return report


def _check_complete(replayed: Tree, final: Tree) -> None:
    """The recorded operations replayed onto the base give the real final tree:
    nothing wrote a durable file around the durable layer."""
    got, want = dict(replayed.files), dict(final.files)
    ignored = {"lock"}  # the run lock: opened, never written through the layer
    missing = sorted(str(p) for p in set(want) - set(got) if p.name not in ignored)
    extra = sorted(str(p) for p in set(got) - set(want))
    differ = sorted(str(p) for p in set(got) & set(want)
                    if got[p] != want[p] and p.name not in ignored)
    dirs = sorted(str(d) for d in final.dirs ^ replayed.dirs)
    if missing or extra or differ or dirs:
        raise AssertionError(
            "the recording is incomplete: files written around statestore/durable.py "
            f"(missing {missing[:5]}, extra {extra[:5]}, different {differ[:5]}, "
            f"directories {dirs[:5]})")


def check_state(spec: harness.JobSpec, work: Path) -> str | None:
    """Recover from the state on disk; ``None`` when every check holds, else the problem
    (``refused: ...`` for a clear refusal)."""
    chk = work / "chk"
    wrong = ahead(chk, "offsets")
    if wrong:
        return f"state ahead of the write-ahead log: {wrong}"
    try:
        run_job(spec, work)
    except USER_ERRORS as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a Rust panic (pyo3 PanicException) is a BaseException
        return f"recovery crashed: {_where(exc)}"
    wrong = ahead(chk, "commits")
    if wrong:
        return f"state ahead of the commit log after recovery: {wrong}"
    try:
        verdict = harness.verify(spec, work)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        return f"output unreadable: {_where(exc)}"
    if not verdict.exact:
        return (f"output not exact: {verdict.missing} missing, {verdict.duplicates} twice, "
                f"{verdict.extra} extra, {verdict.wrong_values} wrong, dead letters "
                f"{verdict.dead_letters}/{verdict.dead_letters_expected}")
    return None


def _where(exc: BaseException) -> str:
    """The error and the project's innermost frame that saw it."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" not in f.filename]
    at = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{at}"
