"""The DuckDB store: the one module that owns the schema, its migrations and every SQL statement.

Why one long module: no SQL may be written anywhere else, so every table's reads and writes, and
every migration, are here.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import uuid
import warnings
from contextlib import contextmanager, nullcontext, suppress
from functools import lru_cache
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import duckdb

from zmlx_pipeline.core.commits import commit_point
from zmlx_pipeline.core.dtypes import DTYPE_BYTES
from zmlx_pipeline.core.errors import ZmlxPipelineError
from zmlx_pipeline.core.files import (
    GIT_LFS_POINTER,
    fsync_dir,
    printable,
    shell_command,
    url_scheme,
    utf8_problem,
)
from zmlx_pipeline.core.keys import canonical_json, mapping_key
from zmlx_pipeline.data.catalog import (
    CatalogError, DeviceSpec, catalog_problems, catalog_sources, registration_problems,
)
from zmlx_pipeline.data.paths import not_regular
from zmlx_pipeline.data.records import (
    DEVICE_ID_PATTERN,
    MAX_NAME_LENGTH,
    STATUSES,
    Measurement,
    fold_name,
    shortened,
    twin_problem,
)

RUN_STATUSES = ("running", "finished", "interrupted", "failed", "imported")
SHARD_FORMAT = "1"


class StoreError(ZmlxPipelineError):
    """The store could not be opened, read or written."""


class SchemaTooNew(StoreError):
    """The store was written by a newer zmlx-pipeline; it is refused and left untouched."""


class StoreLocked(StoreError):
    """Another process holds the store's single-writer lock."""


class StoreNotWritable(StoreError):
    """The store's file or file system refuses writes (permissions, a read-only mount, an immutable file)."""


class CorruptStore(StoreError):
    """The file is not a DuckDB database."""


class BadShard(StoreError):
    """A Parquet shard is unreadable or lacks required columns; nothing of it was ingested."""


class BadDeviceRow(StoreError):
    """A device row a shard's device columns could not hold (a figure that is not finite, above 0 and below 1e15)."""


class DeviceTaken(StoreError):
    """A device id the store holds already, registered with another record or measured as a device of its own."""


# --------------------------------------------------------------------------------------------
# Schema. Migrations are history: never edit a released one, append a new version instead.
# The status lists are frozen here on purpose; test_store checks they still match records.py.

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS _migrations (
    version INTEGER PRIMARY KEY,
    name VARCHAR NOT NULL UNIQUE,
    applied_at TIMESTAMP NOT NULL
)
"""

_M1_INITIAL = """
CREATE TABLE devices (
    device_id VARCHAR PRIMARY KEY,
    name VARCHAR,
    vendor VARCHAR,
    family VARCHAR,
    variant VARCHAR,
    backend VARCHAR,
    architecture VARCHAR,
    gpu_cores INTEGER,
    core_unit VARCHAR,
    memory_bandwidth_gbps DOUBLE,
    max_threads_per_threadgroup INTEGER,
    simd_width INTEGER,
    threadgroup_memory_bytes BIGINT,
    l2_bytes BIGINT,
    clock_mhz DOUBLE,
    memory_gb DOUBLE,
    default_threadgroup INTEGER,
    in_catalog BOOLEAN,
    flagged_unknown BOOLEAN,
    core_limited_from VARCHAR,
    reported_name VARCHAR,
    reported VARCHAR
);
CREATE TABLE runs (
    run_id VARCHAR PRIMARY KEY,
    device_id VARCHAR NOT NULL,
    host VARCHAR,
    backend VARCHAR,
    mlx_version VARCHAR,
    pipeline_version VARCHAR,
    settings VARCHAR,
    started_at TIMESTAMP,
    finished_at TIMESTAMP,
    status VARCHAR NOT NULL
        CHECK (status IN ('running', 'finished', 'interrupted', 'failed', 'imported'))
);
CREATE TABLE measurements (
    run_id VARCHAR NOT NULL,
    device_id VARCHAR NOT NULL,
    kernel VARCHAR NOT NULL,
    kernel_version VARCHAR NOT NULL,
    dtype VARCHAR NOT NULL,
    shape_key VARCHAR NOT NULL,
    shape VARCHAR NOT NULL,
    config_key VARCHAR NOT NULL,
    config VARCHAR NOT NULL,
    status VARCHAR NOT NULL
        CHECK (status IN ('ok', 'wrong_result', 'launch_error', 'compile_error', 'timeout')),
    median_us DOUBLE,
    p10_us DOUBLE,
    p90_us DOUBLE,
    samples INTEGER NOT NULL DEFAULT 0,
    error VARCHAR,
    extra VARCHAR,
    measured_at TIMESTAMP NOT NULL,
    UNIQUE (device_id, kernel, kernel_version, dtype, shape_key, config_key)
);
CREATE TABLE repeats (
    device_id VARCHAR NOT NULL,
    kernel VARCHAR NOT NULL,
    kernel_version VARCHAR NOT NULL,
    dtype VARCHAR NOT NULL,
    shape_key VARCHAR NOT NULL,
    config_key VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    median_us DOUBLE,
    measured_at TIMESTAMP NOT NULL,
    UNIQUE (device_id, kernel, kernel_version, dtype, shape_key, config_key, run_id)
);
"""

_M2_MODELS_BUNDLES = """
CREATE TABLE models (
    model_id VARCHAR PRIMARY KEY,
    kernel_filter VARCHAR,
    created_at TIMESTAMP,
    data_fingerprint VARCHAR,
    params VARCHAR,
    versions VARCHAR,
    scores VARCHAR,
    path VARCHAR
);
CREATE TABLE bundles (
    bundle_id VARCHAR PRIMARY KEY,
    model_id VARCHAR,
    created_at TIMESTAMP,
    path VARCHAR,
    manifest VARCHAR
);
"""

# Per held-out case, how a registered model (and each baseline) ranked it in the folds train scored:
# regret@k for k = 1..10 (r1..r10), the rank of its first config within 2% of the best (hit_rank), the
# case's configs and the method's first pick (pick_key). `data_fingerprint` is the model's, over the rows
# it was fitted on; evaluate and report use these rows only while the store's rows still have it.
_M3_HELDOUT_CASES = """
CREATE TABLE heldout_cases (
    model_id VARCHAR NOT NULL,
    data_fingerprint VARCHAR NOT NULL,
    split VARCHAR NOT NULL,
    protocol VARCHAR NOT NULL,
    method VARCHAR NOT NULL,
    fold VARCHAR NOT NULL,
    device_id VARCHAR NOT NULL,
    kernel VARCHAR NOT NULL,
    dtype VARCHAR NOT NULL,
    shape_key VARCHAR NOT NULL,
    r1 DOUBLE, r2 DOUBLE, r3 DOUBLE, r4 DOUBLE, r5 DOUBLE, r6 DOUBLE, r7 DOUBLE, r8 DOUBLE, r9 DOUBLE, r10 DOUBLE,
    hit_rank INTEGER,
    configs INTEGER NOT NULL,
    pick_key VARCHAR,
    UNIQUE (model_id, split, protocol, method, device_id, kernel, dtype, shape_key)
);
"""

Migration = tuple[int, str, Union[str, Callable[[duckdb.DuckDBPyConnection], None]]]

MIGRATIONS: list[Migration] = [
    (1, "initial", _M1_INITIAL),
    (2, "models_and_bundles", _M2_MODELS_BUNDLES),
    (3, "heldout_cases", _M3_HELDOUT_CASES),
]

SCHEMA_VERSION = MIGRATIONS[-1][0]

DEVICE_COLUMNS = (
    "device_id", "name", "vendor", "family", "variant", "backend", "architecture", "gpu_cores",
    "core_unit", "memory_bandwidth_gbps", "max_threads_per_threadgroup", "simd_width",
    "threadgroup_memory_bytes", "l2_bytes", "clock_mhz", "memory_gb", "default_threadgroup",
    "in_catalog", "flagged_unknown", "core_limited_from", "reported_name", "reported",
)
RUN_COLUMNS = (
    "run_id", "device_id", "host", "backend", "mlx_version", "pipeline_version", "settings",
    "started_at", "finished_at", "status",
)
MEASUREMENT_COLUMNS = (
    "run_id", "device_id", "kernel", "kernel_version", "dtype", "shape_key", "shape",
    "config_key", "config", "status", "median_us", "p10_us", "p90_us", "samples", "error",
    "extra", "measured_at",
)
_MEASUREMENT_TYPES = (
    "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR", "VARCHAR",
    "VARCHAR", "VARCHAR", "VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE", "INTEGER", "VARCHAR",
    "VARCHAR", "TIMESTAMP",
)
_KEY_COLUMNS = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "config_key")
REPEAT_COLUMNS = _KEY_COLUMNS + ("run_id", "median_us", "measured_at")


def _same_key(a: str, b: str) -> str:
    """SQL that holds when tables `a` and `b` name the same measurement key."""
    return " AND ".join(f"{a}.{c} = {b}.{c}" for c in _KEY_COLUMNS)


# A shard's `repeats` column (a JSON list per key) back into the repeats table.
_INGEST_REPEATS_SQL = (
    f"INSERT INTO repeats ({', '.join(REPEAT_COLUMNS)}) "
    "SELECT device_id, kernel, kernel_version, dtype, shape_key, config_key, rep.run_id, rep.median_us, "
    "rep.measured_at FROM (SELECT *, unnest(from_json(repeats, "
    "'[{\"run_id\": \"VARCHAR\", \"median_us\": \"DOUBLE\", \"measured_at\": \"TIMESTAMPTZ\"}]')) AS rep "
    "FROM _zmlx_shard s WHERE repeats IS NOT NULL "
    # only the repeats of the timing the store keeps: an older shard's repeats belong to a timing
    # a newer one replaced, and paired with the new timing they would compare two different runs
    "AND EXISTS (SELECT 1 FROM measurements m WHERE m.run_id = s.run_id AND " + _same_key("m", "s")
    + ")) ON CONFLICT DO NOTHING"
)
# Keys whose stored timing a shard replaces (the shard's is newer), found before the upsert: their
# repeats go with the old timing.
_REPLACED_SQL = (
    "CREATE OR REPLACE TEMP TABLE _zmlx_replaced AS SELECT "
    + ", ".join(f"s.{c}" for c in _KEY_COLUMNS) + " FROM _zmlx_shard s JOIN measurements m ON "
    + _same_key("m", "s") + " WHERE s.measured_at > m.measured_at"
)
_DROP_REPLACED_REPEATS_SQL = (
    "DELETE FROM repeats USING _zmlx_replaced r WHERE " + _same_key("repeats", "r")
)
# The model registry: kernel_filter holds the kernel a model ranks; params/versions/scores are JSON.
MODEL_COLUMNS = ("model_id", "kernel_filter", "created_at", "data_fingerprint", "params", "versions", "scores",
                 "path")
_MODEL_JSON = ("params", "versions", "scores")
HELDOUT_KS = tuple(range(1, 11))  # the regret@k columns of heldout_cases
HELDOUT_KEY_COLUMNS = ("model_id", "data_fingerprint", "split", "protocol")
HELDOUT_CASE_COLUMNS = ("method", "fold", "device_id", "kernel", "dtype", "shape_key",
                        *(f"r{k}" for k in HELDOUT_KS), "hit_rank", "configs", "pick_key")

# What train records of a held-out case (metrics.case_regrets): regret@k is the best time among the method's top k
# over the case's best, so finite, at least 1 and never above that of a smaller k; the first config within 2% of
# the best is among the case's configs. (reason, SQL condition true for a row train could not have written)
_HELDOUT_CHECKS = (
    *((f"r{k} is {{r{k}!r}}, not a regret (a finite ratio of 1 or more: no pick is faster than the case's best)",
       f"r{k} IS NULL OR NOT isfinite(r{k}) OR r{k} < 1 - 1e-9") for k in HELDOUT_KS),
    *((f"r{k} is {{r{k}!r}}, above r{k - 1} {{r{k - 1}!r}} (the best of a top {k} is never slower than that of its "
       f"top {k - 1})", f"r{k} > r{k - 1} * (1 + 1e-9)") for k in HELDOUT_KS[1:]),
    ("configs is {configs!r}, not a count of 1 or more", "configs < 1"),
    ("hit_rank is {hit_rank!r}, not a rank from 1 to the case's {configs} configs",
     "hit_rank IS NULL OR hit_rank < 1 OR hit_rank > configs"),
    # hit_rank is the first rank within 2% of the best, so r{hit_rank} is within 2% and every r{k} before it is not
    ("hit_rank {hit_rank!r} disagrees with the regrets (the first config within 2% of the best is where r@k first "
     "drops to 1.02 or below)",
     f"(hit_rank <= {HELDOUT_KS[-1]} AND (CASE hit_rank "
     + " ".join(f"WHEN {k} THEN r{k}" for k in HELDOUT_KS) + " END) > 1.0201) OR (hit_rank > 1 AND (CASE "
     + " ".join(f"WHEN hit_rank = {k + 1} THEN r{k}" for k in HELDOUT_KS[:-1])
     + f" ELSE r{HELDOUT_KS[-1]} END) < 1.0199)"),
)

# A shard row: the measurement columns, then its device (device_*) and run (run_*) columns.
SHARD_DEVICE_COLUMNS = tuple(f"device_{c}" for c in DEVICE_COLUMNS if c != "device_id")
SHARD_RUN_COLUMNS = tuple(f"run_{c}" for c in RUN_COLUMNS if c not in ("run_id", "device_id"))
SHARD_COLUMNS = MEASUREMENT_COLUMNS + SHARD_DEVICE_COLUMNS + SHARD_RUN_COLUMNS + ("repeats",)
SHARD_REQUIRED = tuple(c for c in MEASUREMENT_COLUMNS if c != "extra")

_JSON_COLUMNS = {"reported", "settings", "shape", "config", "extra"}
_FILTERS = {
    "device": "device_id",
    "kernel": "kernel",
    "kernel_version": "kernel_version",
    "dtype": "dtype",
    "status": "status",
    "run_id": "run_id",
}


def default_db_path() -> Path:
    """Where the store lives: $ZMLX_PIPELINE_DB, else $XDG_DATA_HOME/zmlx-pipeline/store.duckdb. A variable of
    white space only is refused (StoreError), as `--db ''` is: it would make a store named " " wherever one runs."""
    explicit = os.environ.get("ZMLX_PIPELINE_DB")
    if explicit and not explicit.strip():
        raise StoreError(f"$ZMLX_PIPELINE_DB is {explicit!r}, white space only: set it to a path, or unset it for the "
                         "default store")
    if explicit:
        return Path(explicit).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser() / "zmlx-pipeline" / "store.duckdb"


def _now() -> datetime:
    """Current UTC time as a naive timestamp (the store keeps UTC throughout)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _utc(when: datetime) -> datetime:
    """A time as the store keeps it: naive UTC (an aware one converted; a naive one taken as UTC already)."""
    return when if when.tzinfo is None else when.astimezone(timezone.utc).replace(tzinfo=None)


def _first_line(err: BaseException, *quoted: Any) -> str:
    """The first line of an error's text, for one-line messages; `quoted` (paths the error may quote) escaped
    first, so a newline in one does not cut the line short."""
    text = str(err).strip()
    for value in quoted:
        text = text.replace(str(value), printable(str(value)))
    return text.splitlines()[0] if text else type(err).__name__


def _sql_literal(text: str) -> str:
    """A single-quoted SQL string literal (for the few places DuckDB takes no parameter)."""
    return "'" + text.replace("'", "''") + "'"


def _to_json(value: Any) -> str | None:
    """Canonical JSON text for a mapping/list; strings pass through; None stays NULL."""
    if value is None or isinstance(value, str):
        return value
    return canonical_json(value)


def _from_json(value: str | None) -> Any:
    """Parse stored JSON text (None stays None)."""
    return None if value is None else json.loads(value)


def _where(filters: dict[str, Any], prefix: str = "") -> tuple[str, list[Any]]:
    """A WHERE clause from named filters; each value is a string or an iterable of strings."""
    clauses, params = [], []
    for name, value in filters.items():
        if value is None:
            continue
        if name not in _FILTERS:
            raise TypeError(f"unknown filter {name!r}; expected one of {', '.join(_FILTERS)}")
        column = prefix + _FILTERS[name]
        values = [value] if isinstance(value, str) else list(value)
        if not values:
            clauses.append("FALSE")
            continue
        clauses.append(f"{column} IN ({', '.join('?' for _ in values)})")
        params.extend(values)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def _summary_sql(source: str, where: str) -> str:
    """The summary query over any relation with device_id, kernel, dtype, shape_key, status, measured_at."""
    return f"""
        SELECT device_id AS device, kernel, dtype,
               count(*) AS measurements,
               histogram(status) AS by_status,
               count(DISTINCT shape_key) AS shapes,
               count(DISTINCT shape_key) FILTER (WHERE status = 'ok') AS shapes_ok,
               min(measured_at) AS first_measured_at, max(measured_at) AS last_measured_at
        FROM {source}{where}
        GROUP BY device_id, kernel, dtype
        ORDER BY device_id, kernel, dtype
    """


def _summary_rows(cursor: duckdb.DuckDBPyConnection) -> list[dict]:
    """Summary rows as dicts, by_status in STATUSES order with only the statuses present, and when the rows were timed
    (their first and last measured_at, UTC)."""
    order = {s: i for i, s in enumerate(STATUSES)}
    rows = []
    for device, kernel, dtype, n, by_status, shapes, shapes_ok, first, last in cursor.fetchall():
        counts = dict(sorted(by_status.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))
        rows.append({
            "device": device, "kernel": kernel, "dtype": dtype, "measurements": int(n),
            "by_status": {k: int(v) for k, v in counts.items()},
            "shapes": int(shapes), "shapes_ok": int(shapes_ok),
            "first_measured_at": first, "last_measured_at": last,
        })
    return rows


def _dicts(cursor: duckdb.DuckDBPyConnection, parse_json: bool = True) -> list[dict]:
    """Fetch all rows of a cursor as dicts, parsing the JSON text columns."""
    names = [d[0] for d in cursor.description]
    out = []
    for row in cursor.fetchall():
        record = dict(zip(names, row))
        if parse_json:
            for col in _JSON_COLUMNS.intersection(record):
                record[col] = _from_json(record[col])
        out.append(record)
    return out


# what the OS says, through DuckDB, when a file cannot be opened for writing
_NOT_WRITABLE = ("Read-only file system", "Permission denied", "Operation not permitted")


def _open_error(path: Path, err: duckdb.Error, read_only: bool = False) -> StoreError:
    """Translate a DuckDB error raised while opening a file into one of our errors."""
    text = _first_line(err)
    if "Could not set lock" in text:
        pid = re.search(r"\(PID (\d+)\)", text)
        holder = f" (PID {pid.group(1)})" if pid else ""
        return StoreLocked(
            f"store {path} is locked by another process{holder}: wait for it to finish or use another --db"
        )
    if not read_only and any(why in text for why in _NOT_WRITABLE):
        why = next(w for w in _NOT_WRITABLE if w in text)
        return StoreNotWritable(f"store {path} cannot be written ({why}): commands that only read it still work; "
                                "copy it somewhere writable or pass another --db")
    damage = damaged(path, err)
    if damage is not None:
        return damage
    if "not a valid DuckDB database" in text:
        return CorruptStore(f"{path} is not a DuckDB database: move it aside or use another --db")
    if "different configuration" in text:
        return StoreError(
            f"store {path} is already open read-only in this process: close that Store before opening it writable"
        )
    return StoreError(f"cannot open store {path}: {text}")


def make_parent(path: Path, what: str) -> None:
    """Create the directory a file goes into, or raise StoreError saying why it cannot be (one line)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        raise StoreError(f"cannot put the {what} at {path}: {blocker} is a file, not a directory; choose another path") from None
    except OSError as exc:
        raise StoreError(f"cannot create {path.parent} for the {what}: {exc.strerror or exc}") from None


PARQUET_MAGIC = b"PAR1"


def _check_shard_target(target: Path, store_path: Path) -> None:
    """Refuse a shard path that would overwrite what is not a shard: the store itself, a file that is not
    Parquet, a folder, a pipe or a device (StoreError, one line, before anything is written)."""
    if not target.name or target.name in (".", ".."):
        raise StoreError(f"cannot export a shard to {str(target)!r}: give it a file name (e.g. shard.parquet)")
    problem = utf8_problem(target, "shard path")
    if problem is not None:
        raise StoreError(f"cannot export: {problem}; nothing was written")
    try:
        same = target.exists() and store_path.exists() and target.resolve() == store_path.resolve()
        if same:
            raise StoreError(f"cannot export a shard to {target}: that is the store itself; choose another path")
        wal = store_path.resolve().with_name(store_path.resolve().name + ".wal")
        if target.resolve() == wal:  # DuckDB writes (and removes) it beside the store, whether or not it exists now
            raise StoreError(f"cannot export a shard to {target}: that is the store's write-ahead log; choose "
                             "another path")
        if target.is_symlink() or target.exists():
            if not target.is_file():
                raise StoreError(f"cannot export a shard to {target}: it exists and is not a regular file; "
                                 "choose another path")
            with open(target, "rb") as fh:
                head = fh.read(len(PARQUET_MAGIC))
            if head and head != PARQUET_MAGIC:
                raise StoreError(f"cannot export a shard to {target}: it exists and is not a Parquet shard; "
                                 "remove it or choose another path")
    except OSError as exc:
        raise StoreError(f"cannot export a shard to {target}: {exc.strerror or exc}") from None


#: the tables every store of the current schema has (its migrations make them)
SCHEMA_TABLES = ("devices", "runs", "measurements", "repeats", "models", "bundles", "heldout_cases")
_COLUMNS_SQL = ("SELECT table_name, column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'main' AND table_catalog = current_database() "
                "ORDER BY table_name, ordinal_position")


def _table_columns(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[tuple[str, str], ...]]:
    """Each table's (column, type) pairs in column order."""
    tables: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in con.execute(_COLUMNS_SQL).fetchall():
        tables.setdefault(table, []).append((column, kind))
    return {t: tuple(c) for t, c in tables.items()}


@lru_cache(maxsize=4)
def _schema_history(migrations: tuple) -> tuple[tuple[int, dict[str, tuple[tuple[str, str], ...]]], ...]:
    """Per migration version, the tables (with their columns and types) a store at that version has: the
    migrations replayed on an empty in-memory database, so the schema is stated once, in MIGRATIONS."""
    con = duckdb.connect()
    try:
        con.execute(_BOOKKEEPING)
        history = []
        for version, _name, step in migrations:
            try:
                step(con) if callable(step) else con.execute(step)
            except duckdb.Error:  # migrating the store says why it fails; the versions before it are known
                break
            history.append((version, _table_columns(con)))
        return tuple(history)
    finally:
        con.close()
DUCKDB_MAGIC = (8, b"DUCK")  # where a DuckDB file says what it is


def _check_duckdb_header(path: Path) -> None:
    """Refuse an existing file that is not a DuckDB database before DuckDB opens it: DuckDB would otherwise take
    a SQLite file for one to attach, and try to download an extension to read it."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return
        offset, magic = DUCKDB_MAGIC
        with open(path, "rb") as fh:
            fh.seek(offset)
            head = fh.read(len(magic))
    except OSError:
        return  # DuckDB says why it cannot open it
    if head != magic:
        raise CorruptStore(f"{path} is not a DuckDB database: move it aside or use another --db")


def damaged(path: Path, err: BaseException) -> CorruptStore | None:
    """The one-line CorruptStore for a DuckDB error that says the store's own file cannot be read back (cut short,
    a block failing its checksum), else None; so a damaged store reads the same wherever a command meets it."""
    if not isinstance(err, duckdb.Error):
        return None
    text = _first_line(err)
    if "Corrupt database file" not in text:
        named = re.findall(r'file "([^"]*)"', text)
        if not isinstance(err, duckdb.IOException) or "Could not read" not in text:
            return None
        if named and not any(_same_file(Path(n), path) for n in named):
            return None  # another file (a shard being read or written) failed, not the store
    return CorruptStore(f"store {path} is damaged ({text}): restore it from a copy or pass another --db")


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (by inode when both exist, else by absolute path)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.abspath(a) == os.path.abspath(b)


#: where DuckDB's blocks start in its file: after the file header and the two database headers, 4 KiB each
_DUCKDB_BLOCKS_START = 3 * 4096


def wal_path(path: Path) -> Path:
    """The write-ahead log DuckDB keeps beside a store: committed writes not yet checkpointed into its file."""
    return path.with_name(path.name + ".wal")


def _read_every_block(con: duckdb.DuckDBPyConnection) -> None:
    """Read every column of every table once (DuckDB checks each block it reads), raising DuckDB's error for a
    block that is not there or reads back wrong."""
    tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
                         "AND schema_name = 'main'").fetchall()
    for (table,) in tables:
        quoted = '"' + table.replace('"', '""') + '"'
        con.execute(f"SELECT count(*), bit_xor(hash({quoted})) FROM main.{quoted}").fetchone()


def _check_whole(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """CorruptStore when the file cannot hold the blocks its header lists (a copy cut short), read at once from
    DuckDB's own block counts, so a command fails before its work, not midway or (summary) never. DuckDB writes
    whole blocks and cuts only free ones off the end of its file: missing more blocks than are free lost data, and
    so does a file ending inside a block, unless a write-ahead log lies beside it: a checkpoint that stopped
    midway (a full disk) leaves a part block at the end while its header still names the old blocks and the log
    holds what it was writing, so there every block is read once and only a read that fails is damage."""
    try:
        block_size, blocks, free = con.execute(
            "SELECT block_size, total_blocks, free_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()").fetchone()
        size = path.stat().st_size
    except (duckdb.Error, OSError, TypeError):  # no such row or no file: the schema check that follows says why
        return
    held, partial = divmod(max(size - _DUCKDB_BLOCKS_START, 0), int(block_size))
    missing = int(blocks) - held > int(free)
    if partial and not missing:
        try:
            logged = wal_path(path).stat().st_size > 0
        except OSError:
            logged = False
        if logged:
            _read_every_block(con)  # a block that cannot be read raises DuckDB's error, which the caller calls damage
            return
    if partial or missing:
        why = (f"cut short: its file holds {size} bytes, too few for the {int(blocks) - int(free)} blocks of "
               f"{block_size} bytes it uses" if missing else
               f"its file of {size} bytes ends {partial} bytes into a block after its {held} whole blocks of "
               f"{block_size} bytes, with no write-ahead log beside it: bytes were added to its end or a write "
               "stopped midway")
        raise CorruptStore(f"store {path} is damaged ({why}): restore it from a copy or pass another --db")


def _checkpoint(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Move the write-ahead log into the store file; when that fails (a full disk) warn in one line: nothing is
    lost, as every commit is in the log, which DuckDB reads back on each open until a later checkpoint succeeds."""
    try:
        con.execute("CHECKPOINT")
    except duckdb.Error as err:
        text = _first_line(err)
        if "Failed to create checkpoint" not in text:
            return  # not the checkpoint's own failure (an earlier fatal error, another open transaction)
        why = re.sub(r"^.*?Failed to create checkpoint because of error: ", "", text)
        warnings.warn(f"store {path}: its changes are kept in its write-ahead log {wal_path(path)} but could not be "
                      f"written into the store file ({why}); commands read them from the log, and the next command "
                      "that writes the store moves them in once the disk has room", stacklevel=3)


def _encodable(path: Path) -> None:
    """StoreError (one line) for a store path DuckDB cannot be given: it takes paths as UTF-8 text (utf8_problem)."""
    problem = utf8_problem(path, "store path")
    if problem is not None:
        raise StoreError(f"{problem}; nothing was written")


def _duckdb_name(path: Path) -> str:
    """The path as DuckDB is given it: a relative path whose first part holds a colon starts with ./, as DuckDB
    reads `name:...` as a database type to load an extension for (md:, s3:), or `:memory:` as no file."""
    text = str(path)
    if not path.is_absolute() and ":" in path.parts[0]:
        return os.path.join(".", text)
    return text


def _check_store_path(path: Path) -> None:
    """Refuse, saying what to pass instead, a store path that cannot be a store file: a URL (which DuckDB would
    fetch through an extension it downloads), a directory, a FIFO, a device, a socket or a symlink loop (which would
    otherwise read as DuckDB's raw I/O error, hang on the FIFO, or read as 'no store there'), before DuckDB opens
    it."""
    scheme = url_scheme(str(path), in_path=True)  # the store's path went through Path: s3:// reads s3:/ here
    if scheme is not None:
        raise StoreError(f"store path {path} is a URL ({scheme}:), not a file: the store must be a local file path; "
                         "pass one with --db or $ZMLX_PIPELINE_DB")
    if os.sep == "/" and "\\" in str(path):  # DuckDB opens x\y.duckdb as x/y.duckdb: not the file checked here
        raise StoreError(f"store path {path} holds a backslash, which DuckDB reads as a folder separator: write the "
                         "path with / (or name the file without \\) in --db or $ZMLX_PIPELINE_DB")
    if path.name != path.name.strip():
        # "x.duckdb " is another file than x.duckdb, and nothing in a message shows the space
        raise StoreError(f"store path {str(path)!r} has white space at the start or end of its file name, which makes "
                         f"it another file than {path.name.strip()!r}: write the name without it in --db or "
                         "$ZMLX_PIPELINE_DB")
    if str(path).rstrip("/").endswith(("/..", "/.")) or str(path).rstrip("/") in ("..", ".", "") \
            or str(path).endswith("/"):
        # a folder however it resolves (x/.. names the folder holding x, and opening it made x first)
        raise StoreError(f"store path {path} names a directory, not a store file: pass a file (e.g. "
                         f"{Path(os.path.normpath(path)) / 'store.duckdb'}) with --db or $ZMLX_PIPELINE_DB")
    try:
        _encodable(path)
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"store path {path} is a symlink loop: point the link at a store file, or pass another "
                             "--db") from None
        return  # a missing file (or a link to one): made, or refused as 'no store', by the caller
    if stat.S_ISDIR(mode):
        raise StoreError(f"store path {path} is a directory, not a store file: pass a file in it "
                         f"(e.g. {path / 'store.duckdb'}) with --db or $ZMLX_PIPELINE_DB")
    kind = not_regular(mode)
    if kind is not None:
        raise StoreError(f"store path {path} is {kind}, not a store file: pass the path of a store file (or of one "
                         "to create) with --db or $ZMLX_PIPELINE_DB")


def _connect(path: Path, read_only: bool, create: bool = True) -> duckdb.DuckDBPyConnection:
    """Open a DuckDB connection, mapping lock, corruption and missing-file errors. A missing file is
    created only when opening writable with `create`."""
    _check_store_path(path)
    if (read_only or not create) and not path.exists():
        link = f" (a symlink to {os.readlink(path)}, which does not exist)" if path.is_symlink() else ""
        raise StoreError(f"no store at {path}{link}: run a collect, import or ingest first, or pass another --db")
    if not read_only:
        if path.is_symlink() and not path.exists() and not Path(os.path.realpath(path)).parent.is_dir():
            raise StoreError(f"cannot create the store at {path}: it is a symlink to {os.readlink(path)}, whose folder "
                             "does not exist; create that folder, point the link at a store file, or pass another --db")
        make_parent(path, "store")
    _check_duckdb_header(path)
    try:
        return in_utc(duckdb.connect(_duckdb_name(path), read_only=read_only))
    except duckdb.Error as err:
        if not (read_only and "different configuration" in str(err)):
            raise _open_error(path, err, read_only) from err
    # This process already holds the store writable: share that instance; Store still refuses writes.
    try:
        return in_utc(duckdb.connect(_duckdb_name(path)))
    except duckdb.Error as err:
        raise _open_error(path, err) from err


def in_utc(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """The connection working in UTC, whatever the process's TZ: the store keeps naive UTC timestamps, and DuckDB
    (with ICU) otherwise converts a shard's time-zone-aware timestamps, and compares them with ours, in local time.
    Without ICU there is no such setting and DuckDB already works in UTC."""
    try:
        con.execute("SET TimeZone = 'UTC'")
    except duckdb.Error:
        pass
    return con


def _measurement_row(m: Measurement, measured_at: datetime) -> tuple:
    """One measurements-table row (MEASUREMENT_COLUMNS order) from a Measurement."""
    return (
        m.run_id, m.device_id, m.kernel, m.kernel_version, m.dtype, m.shape_key, m.shape_json,
        m.config_key, m.config_json, m.status, m.median_us, m.p10_us, m.p90_us, int(m.samples),
        m.error, canonical_json(m.extra) if m.extra else None, measured_at,
    )


class Store:
    """One DuckDB file holding devices, runs, measurements, repeats, models and bundles."""

    def __init__(self, path: str | os.PathLike | None = None, read_only: bool = False, create: bool = True) -> None:
        """`create=False`: refuse a path with no store (StoreError) instead of creating an empty one there, for
        a writer that only works on stored measurements (train, repeat): a typo in --db leaves nothing behind."""
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.read_only = read_only
        self._con: duckdb.DuckDBPyConnection | None = _connect(self.path, read_only, create)
        self._atomic = 0  # depth of atomic() blocks: inside one, each write joins its transaction
        try:
            _check_whole(self._con, self.path)
            self._open_schema()
        except duckdb.Error as err:
            self.close()
            damage = damaged(self.path, err)
            if damage is None:
                raise
            raise damage from err
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "writable"
        return f"Store({str(self.path)!r}, {mode}{', closed' if self._con is None else ''})"

    def close(self) -> None:
        """Close the connection (idempotent); the file lock goes with the last connection. A writable store is
        checkpointed first, so a checkpoint the disk refuses is said, not passed over as DuckDB's own close does."""
        if self._con is not None:
            con, self._con = self._con, None
            try:
                if not self.read_only:
                    _checkpoint(con, self.path)
            finally:
                con.close()

    @property
    def _conn(self) -> duckdb.DuckDBPyConnection:
        """The open connection; raises StoreError once the store is closed."""
        if self._con is None:
            raise StoreError(f"store {self.path} is closed")
        return self._con

    def _require_writable(self, action: str) -> None:
        """Refuse a write on a read-only store with a message saying how to fix it."""
        if self.read_only:
            raise StoreError(f"cannot {action}: store {self.path} is open read-only; open it writable")

    @contextmanager
    def atomic(self) -> Iterator["Store"]:
        """Every write in the block is one transaction: all of it is committed at the end, or, on any exception
        (Ctrl-C included), none of it, so a stopped or refused write of several steps (an import) leaves the store
        as it was."""
        self._require_writable("write")
        try:
            with self._transaction(final=True):
                self._atomic += 1
                try:
                    yield self
                finally:
                    self._atomic -= 1
        except duckdb.InterruptException:
            raise  # a stop, not a failure: the command ends as aborted
        except duckdb.Error as err:
            raise StoreError(f"nothing was written to {self.path}: {_first_line(err)}") from err

    @contextmanager
    def _transaction(self, final: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN ... COMMIT, rolled back on any exception (KeyboardInterrupt included); inside atomic(), the
        statements join its transaction, which commits or rolls back. `final`: its COMMIT is the step that makes
        a command's work final (core.commits: a stop during or after it no longer reports a failure)."""
        con = self._conn
        if self._atomic:
            yield con
            return
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
            with commit_point() if final else nullcontext():
                con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise

    # -- schema ------------------------------------------------------------------------------

    def _stored_version(self) -> int:
        """Highest applied migration (0 for an empty file); refuses foreign DuckDB files."""
        tables = {
            r[0]
            for r in self._conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'main' AND table_catalog = current_database()"
            ).fetchall()
        }
        if "_migrations" not in tables:
            if tables & set(SCHEMA_TABLES):
                raise self._damaged_record("has no _migrations table")
            if tables:
                raise StoreError(
                    f"{self.path} is a DuckDB database but not a zmlx-pipeline store "
                    f"(tables: {', '.join(sorted(tables))}): use another --db"
                )
            return 0
        try:
            versions = [int(r[0]) for r in self._conn.execute(
                "SELECT version FROM _migrations ORDER BY version").fetchall()]
        except (duckdb.Error, TypeError, ValueError) as err:
            raise self._damaged_record(f"has an unreadable _migrations table ({_first_line(err)})") from None
        version = versions[-1] if versions else 0
        if versions != list(range(1, version + 1)):
            raise self._damaged_record(f"records migrations {versions}, not 1 to {version}")
        # a table a later migration makes, in a store that records no such migration: the record lost rows
        history = dict(_schema_history(tuple(MIGRATIONS)))
        if version > max(history, default=0):
            return version  # a newer zmlx-pipeline's store: refused as such
        made = set(history.get(version, {"_migrations": ()}))
        later = tables & set().union(*history.values()) - made
        if later:
            listed = f"migrations up to {version}" if version else "no migration"
            raise self._damaged_record(f"records {listed} but holds table {', '.join(sorted(set(later)))}")
        return version

    def _damaged_record(self, what: str) -> CorruptStore:
        """CorruptStore for a store whose record of applied migrations no longer matches its tables."""
        return CorruptStore(f"store {self.path}'s migration record is damaged (it {what}): it was changed outside "
                            "zmlx-pipeline, and migrating it again would fail; restore it from a copy, or ingest its "
                            "shards into a new --db")

    def _open_schema(self) -> None:
        """Check the stored schema version and migrate forward when writable."""
        migrations = MIGRATIONS
        latest = migrations[-1][0]
        current = self._stored_version()
        if current > latest:
            raise SchemaTooNew(
                f"store {self.path} was written by schema version {current}, newer than this "
                f"zmlx-pipeline ({latest}): upgrade zmlx-pipeline or use another --db"
            )
        if current == latest:
            self._check_tables(current)
            return
        if self.read_only:
            raise StoreError(
                f"store {self.path} has schema version {current}, older than this zmlx-pipeline "
                f"({latest}): open it writable once (any collect or ingest) to migrate it"
            )
        for version, name, step in migrations:
            if version <= current:
                continue
            try:
                with self._transaction() as con:
                    con.execute(_BOOKKEEPING)
                    if callable(step):
                        step(con)
                    else:
                        con.execute(step)
                    con.execute(
                        "INSERT INTO _migrations (version, name, applied_at) VALUES (?, ?, ?)",
                        [version, name, _now()],
                    )
            except duckdb.Error as err:
                raise StoreError(
                    f"migration {version} ({name}) failed on {self.path}, which stays at schema "
                    f"version {current}: {_first_line(err)}"
                ) from err
            current = version
        self._check_tables(current)

    def _check_tables(self, version: int) -> None:
        """CorruptStore (one line) when a table of the store's schema version is gone, or a column of one is gone,
        renamed, added or of another type: the file was changed by other means, and every later read would fail
        on it (one query of the catalog, so every open checks it)."""
        expected = dict(_schema_history(tuple(MIGRATIONS))).get(version)
        if expected is None:
            return
        found = _table_columns(self._conn)
        fix = "it was changed outside zmlx-pipeline; restore it from a copy, or ingest its shards into a new --db"
        missing = [t for t in expected if t not in found]
        if missing:
            raise CorruptStore(f"store {self.path} has no table {', '.join(missing)}: {fix}")
        for table, columns in expected.items():
            have = found[table]
            if have == columns:
                continue
            types = dict(have)
            for name, kind in columns:
                if name not in types:
                    raise CorruptStore(f"store {self.path}: table {table} has no column {name} ({kind}): {fix}")
                if types[name] != kind:
                    raise CorruptStore(f"store {self.path}: column {table}.{name} is {types[name]}, not {kind}: {fix}")
            extra = [n for n, _ in have if n not in dict(columns)]
            if extra:
                raise CorruptStore(f"store {self.path}: table {table} has column {', '.join(extra)}, which its schema "
                                   f"has not: {fix}")

    @property
    def schema_version(self) -> int:
        """The schema version stored in the file."""
        return self._stored_version()

    def migrations(self) -> list[dict]:
        """Applied migrations: version, name, applied_at, oldest first."""
        cur = self._conn.execute("SELECT version, name, applied_at FROM _migrations ORDER BY version")
        return _dicts(cur, parse_json=False)

    # -- devices -----------------------------------------------------------------------------

    def upsert_device(self, row: dict, keep_known: bool = False) -> None:
        """Insert or update one device; only the given known columns change, unknown keys are ignored.
        `keep_known`: a None in `row` keeps what the store knows (a file that names no GPU erases no name)."""
        self._require_writable("upsert a device")
        if not row.get("device_id"):
            raise StoreError("a device row needs a non-empty device_id")
        cols = [c for c in DEVICE_COLUMNS if c in row]
        values = [_to_json(row[c]) if c in _JSON_COLUMNS else row[c] for c in cols]
        updates = [c for c in cols if c != "device_id"]
        value = "coalesce(excluded.{c}, devices.{c})" if keep_known else "excluded.{c}"
        conflict = (
            "DO UPDATE SET " + ", ".join(f"{c} = " + value.format(c=c) for c in updates)
            if updates else "DO NOTHING"
        )
        sql = (
            f"INSERT INTO devices ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
            f"ON CONFLICT (device_id) {conflict}"
        )
        try:
            with self._transaction() as con:
                con.execute(sql, values)
        except duckdb.Error as err:
            raise StoreError(f"cannot store device {row['device_id']!r}: {_first_line(err)}") from err

    def devices(self) -> list[dict]:
        """All devices, by device_id, with `reported` parsed from JSON. Train, evaluate and publish read their specs
        here, so a row export would refuse is refused first (_check_devices: CorruptStore, one line)."""
        rows = _dicts(self._conn.execute(f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices ORDER BY device_id"),
                      parse_json=False)
        self._check_devices(rows)
        for row in rows:
            row["reported"] = _from_json(row["reported"])
        return rows

    def register_device(self, row: dict, record: dict, replace: bool = False) -> str:
        """Store a device the catalog lacks: its `devices` row (DEVICE_COLUMNS), not in the catalog and not flagged,
        with its record under `reported`'s REGISTRATION key, in one transaction. Returns "added", "unchanged" (this
        record is registered already) or, with `replace`, "replaced": the figures of a device registered with another
        record are this record's, its measurements and the name its files or backend reported kept. DeviceTaken when
        the id is stored otherwise (or registered otherwise, without `replace`); BadDeviceRow for a row export would
        refuse (device_row_problem)."""
        self._require_writable("register a device")
        device_id = row["device_id"]
        full = {c: row.get(c) for c in DEVICE_COLUMNS}
        full.update(in_catalog=False, flagged_unknown=False, core_limited_from=None,
                    reported=_to_json({REGISTRATION: record}))
        problem = device_row_problem(full)
        if problem is not None:
            raise BadDeviceRow(f"device {device_id!r}: {problem}")
        try:
            with self._transaction() as con:
                stored = con.execute("SELECT in_catalog, reported, vendor, backend, core_unit FROM devices "
                                     "WHERE device_id = ?", [device_id]).fetchone()
                if stored is not None:
                    held = _registration(stored[1]) if not stored[0] else None
                    if held is None:
                        raise DeviceTaken(f"device {device_id!r} is in store {self.path} already, a device measured "
                                          "already: a registration does not change it; give the record another id")
                    differs = _record_differs(held, record)
                    if differs is None:
                        return "unchanged"
                    if not replace:
                        raise DeviceTaken(f"device {device_id!r} is in store {self.path} already, registered with "
                                          f"another record{differs}: give the record another id, or pass --replace to "
                                          "change its figures")
                    kind = next(((c, was) for c, was in zip(("vendor", "backend", "core_unit"), stored[2:])
                                 if was != full[c]), None)
                    if kind is not None:  # its measurements were timed on such a chip: another kind is another device
                        raise DeviceTaken(f"device {device_id!r} is registered with {kind[0]} {kind[1]!r}, and --replace "
                                          f"mends a device's figures, not what kind of chip it is ({kind[0]} "
                                          f"{full[kind[0]]!r}): give the record another id")
                    kept = _from_json(stored[1])
                    full["reported"] = _to_json({**kept, REGISTRATION: record})
                    changed = [c for c in DEVICE_COLUMNS if c not in ("device_id", "reported_name")]
                    con.execute(f"UPDATE devices SET {', '.join(f'{c} = ?' for c in changed)} WHERE device_id = ?",
                                [*(full[c] for c in changed), device_id])
                    return "replaced"
                con.execute(f"INSERT INTO devices ({', '.join(DEVICE_COLUMNS)}) "
                            f"VALUES ({', '.join('?' for _ in DEVICE_COLUMNS)})", [full[c] for c in DEVICE_COLUMNS])
        except duckdb.Error as err:
            raise StoreError(f"cannot register device {device_id!r}: {_first_line(err)}") from err
        return "added"

    def registered_devices(self) -> tuple[DeviceSpec, ...]:
        """The devices registered in this store (`devices add`), by id, as catalog rows; CorruptStore (one line) for
        a record no registration writes, one the catalog's checks of a row refuse (changed outside zmlx-pipeline)."""
        rows = self._conn.execute("SELECT device_id, reported FROM devices WHERE NOT coalesce(in_catalog, false) "
                                  "ORDER BY device_id").fetchall()
        out = []
        for device_id, reported in rows:
            record = _registration(reported)
            if record is None:
                continue
            try:
                spec = DeviceSpec.from_json(record.get("device"))
                if spec.id != device_id:
                    raise CatalogError(f"its record is of device {spec.id!r}")
                declared = record.get("sources")
                problems = catalog_problems((spec,), {**catalog_sources(), **(declared if isinstance(declared, dict)
                                                                              else {})})
                if problems:
                    raise CatalogError(problems[0].text)
            except (CatalogError, AttributeError) as err:
                raise CorruptStore(f"store {self.path} holds a device registration no `devices add` would write "
                                   f"({printable(str(device_id))}: {_first_line(err)}), so nothing was read: it was "
                                   "changed outside zmlx-pipeline; restore it from a copy, or delete that row and "
                                   "register the device again") from None
            out.append(spec)
        return tuple(out)

    def _check_devices(self, rows: Iterable[dict], what: str = "read") -> None:
        """CorruptStore (one line, naming the row and the column) for a devices row (unparsed) whose figures a shard's
        row may not give (_device_problem: a figure that is not a finite number above 0, `reported` that is not a JSON
        object, a catalog chip's figure that is not the catalog's, a vendor, backend or core unit none of the catalog's,
        a core_limited_from its id does not name): only a change outside zmlx-pipeline puts one there,
        and every feature and prediction of that device would be computed from it."""
        for row in rows:
            problem = _device_problem(row)
            if problem is not None:
                raise CorruptStore(
                    f"store {self.path} holds a device row no ingest would take (devices table, "
                    f"{printable(str(row['device_id']))}: {problem}), so nothing was {what}: it was changed outside "
                    "zmlx-pipeline; restore it from a copy, or delete that row and ingest its shards again")

    # -- runs --------------------------------------------------------------------------------

    def start_run(
        self,
        device_id: str,
        *,
        host: str | None,
        backend: str | None,
        mlx_version: str | None,
        pipeline_version: str | None,
        settings: dict | None,
        status: str = "running",
        started_at: datetime | None = None,
    ) -> str:
        """Record the start of a collect or import; returns its run_id (uuid4 hex). `started_at`: when its first row
        was timed, where that was before now (an imported file's first timestamp); else now."""
        self._require_writable("start a run")
        if status not in RUN_STATUSES:
            raise StoreError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATUSES)}")
        run_id = uuid.uuid4().hex
        with self._transaction() as con:
            con.execute(
                f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) VALUES ({', '.join('?' for _ in RUN_COLUMNS)})",
                [run_id, device_id, host, backend, mlx_version, pipeline_version,
                 _to_json(settings or {}), _now() if started_at is None else _utc(started_at), None, status],
            )
        return run_id

    def finish_run(self, run_id: str, status: str) -> None:
        """Mark a run finished, interrupted, failed or imported, stamping finished_at."""
        self._require_writable("finish a run")
        if status not in RUN_STATUSES:
            raise StoreError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATUSES)}")
        with self._transaction() as con:
            changed = con.execute(
                "UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?", [status, _now(), run_id]
            ).fetchone()[0]
        if not changed:
            raise StoreError(f"no run {run_id!r} in store {self.path}")

    def runs(self, device: str | None = None) -> list[dict]:
        """All runs (optionally of one device), oldest first, with `settings` parsed."""
        where, params = _where({"device": device})
        cur = self._conn.execute(
            f"SELECT {', '.join(RUN_COLUMNS)} FROM runs{where} ORDER BY started_at, run_id", params
        )
        return _dicts(cur)

    # -- measurements ------------------------------------------------------------------------

    def measured_keys(self, device_id: str, kernel: str, kernel_version: str) -> set[tuple[str, str, str]]:
        """(dtype, shape_key, config_key) already stored for a device and kernel version (for resume)."""
        rows = self._conn.execute(
            "SELECT dtype, shape_key, config_key FROM measurements "
            "WHERE device_id = ? AND kernel = ? AND kernel_version = ?",
            [device_id, kernel, kernel_version],
        ).fetchall()
        return {tuple(r) for r in rows}

    def stored_results(self, device_id: str, kernel: str, kernel_version: str) -> dict[tuple[str, str, str], tuple]:
        """(dtype, shape_key, config_key) -> (status, median_us, p10_us, p90_us, samples) of every key stored for a
        device and kernel version: what an import compares its own results of those keys with."""
        rows = self._conn.execute(
            "SELECT dtype, shape_key, config_key, status, median_us, p10_us, p90_us, samples FROM measurements "
            "WHERE device_id = ? AND kernel = ? AND kernel_version = ?", [device_id, kernel, kernel_version],
        ).fetchall()
        return {tuple(r[:3]): tuple(r[3:]) for r in rows}

    def kernel_names(self) -> list[str]:
        """The distinct kernel names the store holds measurements of, sorted."""
        return [k for (k,) in self._conn.execute("SELECT DISTINCT kernel FROM measurements ORDER BY 1").fetchall()]

    def kernel_spaces(self, prefix: str) -> list[tuple[str, list[str], list[str]]]:
        """(kernel, parameter names, shape dim names) of every distinct config space stored under a kernel name
        that begins with `prefix` (the name itself and those derived from it): what an import places a file by."""
        rows = self._conn.execute(
            "SELECT DISTINCT kernel, list_sort(json_keys(config::JSON)), list_sort(json_keys(shape::JSON)) "
            "FROM measurements WHERE starts_with(kernel, ?) ORDER BY ALL", [prefix]).fetchall()
        return [(kernel, list(params), list(dims)) for kernel, params, dims in rows]

    def kernel_contents(self, kernel: str) -> dict | None:
        """What the store holds of one kernel, None when no row: its distinct configs and shapes (parsed), dtypes and
        versions, rows per device and dtype (summary's), and its runs, each with its rows and first and last
        measured_at."""
        self._check_stored({"kernel": kernel})
        con = self._conn
        configs = [_from_json(c) for (c,) in con.execute(
            "SELECT DISTINCT config FROM measurements WHERE kernel = ? ORDER BY 1", [kernel]).fetchall()]
        if not configs:
            return None
        shapes = [_from_json(s) for (s,) in con.execute(
            "SELECT DISTINCT shape FROM measurements WHERE kernel = ? ORDER BY 1", [kernel]).fetchall()]
        versions = [v for (v,) in con.execute(
            "SELECT DISTINCT kernel_version FROM measurements WHERE kernel = ? ORDER BY 1", [kernel]).fetchall()]
        runs = _dicts(con.execute(
            "SELECT m.run_id, any_value(m.device_id) AS device_id, any_value(r.status) AS status, "
            "any_value(r.settings) AS settings, any_value(r.started_at) AS started_at, "
            "any_value(r.finished_at) AS finished_at, count(*) AS rows, min(m.measured_at) AS first_measured_at, "
            "max(m.measured_at) AS last_measured_at "
            "FROM measurements m LEFT JOIN runs r ON r.run_id = m.run_id WHERE m.kernel = ? "
            "GROUP BY m.run_id ORDER BY first_measured_at, m.run_id", [kernel]))
        return {"kernel": kernel, "configs": configs, "shapes": shapes, "kernel_versions": versions,
                "devices": self.summary(kernel=kernel), "runs": runs}

    def stored_config(self, kernel: str, kernel_version: str) -> dict | None:
        """One stored config of a kernel version (as a dict), or None when it has none: what an import compares its
        parameters' values with."""
        row = self._conn.execute("SELECT config FROM measurements WHERE kernel = ? AND kernel_version = ? LIMIT 1",
                                 [kernel, kernel_version]).fetchone()
        return None if row is None else _from_json(row[0])

    def record(self, measurements: Iterable[Measurement]) -> int:
        """Insert a batch in one transaction, skipping keys already stored; returns rows added. A measurement's own
        measured_at (an imported file's timestamp) is kept when it passes measured_at_problem, else it is now."""
        self._require_writable("record measurements")
        now = _now()
        rows = []
        for m in measurements:
            when = now if m.measured_at is None else _utc(m.measured_at)
            problem = None if m.measured_at is None else measured_at_problem(when, now)
            if problem is not None:
                raise StoreError(f"none of the measurements were recorded in {self.path}: {problem} ({m.kernel} on "
                                 f"{m.device_id}, {m.dtype}, shape {m.shape_json:.80}, config {m.config_json:.80})")
            rows.append(_measurement_row(m, when))
        if not rows:
            return 0
        columns = [list(col) for col in zip(*rows)]
        select = ", ".join(f"unnest(?::{t}[])" for t in _MEASUREMENT_TYPES)
        sql = (
            f"INSERT INTO measurements ({', '.join(MEASUREMENT_COLUMNS)}) SELECT {select} "
            "ON CONFLICT DO NOTHING"
        )
        try:
            with self._transaction() as con:
                (added,) = con.execute(sql, columns).fetchone()
        except duckdb.Error as err:
            raise StoreError(
                f"none of {len(rows)} measurements were recorded in {self.path}: {_first_line(err)}"
            ) from err
        return int(added)

    def delete_measurements(self, keys: Iterable[Sequence[str]], repeats: bool = False) -> int:
        """Delete the measurements of these (device_id, kernel, kernel_version, dtype, shape_key, config_key)
        keys in one transaction, so that the next collect measures them again; returns rows deleted. `repeats`:
        their repeated timings too (a timing that replaces them must not be paired with another's repeats)."""
        self._require_writable("delete measurements")
        rows = [tuple(k) for k in keys]
        if any(len(k) != len(_KEY_COLUMNS) for k in rows):
            raise StoreError(f"a measurement key has {len(_KEY_COLUMNS)} parts: {', '.join(_KEY_COLUMNS)}")
        if not rows:
            return 0
        columns = [list(col) for col in zip(*rows)]
        select = ", ".join(f"unnest(?::VARCHAR[]) AS {c}" for c in _KEY_COLUMNS)
        try:
            with self._transaction() as con:
                if repeats:
                    con.execute(f"DELETE FROM repeats WHERE ({', '.join(_KEY_COLUMNS)}) IN (SELECT {select})", columns)
                (deleted,) = con.execute(
                    f"DELETE FROM measurements WHERE ({', '.join(_KEY_COLUMNS)}) IN (SELECT {select})", columns,
                ).fetchone()
        except duckdb.Error as err:
            raise StoreError(f"nothing was deleted from {self.path}: {_first_line(err)}") from err
        return int(deleted)

    def record_repeat(self, measurements: Iterable[Measurement]) -> int:
        """Store repeated timings of already-measured keys (one per key and run); returns rows added."""
        self._require_writable("record repeats")
        now = _now()
        rows = [
            (m.device_id, m.kernel, m.kernel_version, m.dtype, m.shape_key, m.config_key,
             m.run_id, m.median_us, now)
            for m in measurements
        ]
        if not rows:
            return 0
        columns = [list(col) for col in zip(*rows)]
        types = ("VARCHAR",) * 7 + ("DOUBLE", "TIMESTAMP")
        select = ", ".join(f"unnest(?::{t}[])" for t in types)
        try:
            with self._transaction() as con:
                (added,) = con.execute(
                    f"INSERT INTO repeats ({', '.join(REPEAT_COLUMNS)}) SELECT {select} ON CONFLICT DO NOTHING",
                    columns,
                ).fetchone()
        except duckdb.Error as err:
            raise StoreError(f"none of {len(rows)} repeats were recorded in {self.path}: {_first_line(err)}") from err
        return int(added)

    def repeats(self, **filters: Any) -> list[dict]:
        """Repeated timings, filtered like measurements() (device, kernel, kernel_version, dtype, run_id)."""
        where, params = _where(filters)
        cur = self._conn.execute(
            f"SELECT {', '.join(REPEAT_COLUMNS)} FROM repeats{where} "
            "ORDER BY device_id, kernel, kernel_version, dtype, shape_key, config_key, measured_at",
            params,
        )
        return _dicts(cur, parse_json=False)

    def repeat_pairs(self, device: str | None = None) -> list[dict]:
        """Each repeated timing next to the first: device, kernel, dtype, shape_key, config_key, median_us, repeat_us."""
        self._check_stored({"device": device})
        bad = self._conn.execute(
            "SELECT device_id, kernel, dtype, median_us, count(*) OVER () FROM repeats WHERE median_us IS NOT NULL AND "
            "NOT isfinite(median_us) LIMIT 1").fetchone()
        if bad is not None:
            raise CorruptStore(
                f"store {self.path} holds a repeated timing no ingest would take ({bad[0]}, {bad[1]}, {bad[2]}: "
                f"median_us {bad[3]!r}){f' ({bad[4] - 1} more like it)' if bad[4] > 1 else ''}: it was changed "
                "outside zmlx-pipeline; restore it from a copy, or delete those repeats")
        where, params = _where({"device": device}, prefix="m.")
        cur = self._conn.execute(
            "SELECT m.device_id, m.kernel, m.dtype, m.shape_key, m.config_key, m.median_us, r.median_us AS repeat_us "
            "FROM repeats r JOIN measurements m USING (device_id, kernel, kernel_version, dtype, shape_key, config_key)"
            f"{where}{' AND' if where else ' WHERE'} m.status = 'ok' AND m.median_us > 0 AND r.median_us > 0 "
            "ORDER BY m.device_id, m.kernel, m.dtype, m.shape_key, m.config_key",
            params,
        )
        return _dicts(cur, parse_json=False)

    def _check_stored(self, filters: dict[str, Any], what: str = "read") -> None:
        """CorruptStore (one line, naming the row) when a stored measurement of these filters fails a check ingest
        applies (a NaN, non-positive or missing time of an ok row, a config or shape that is not a JSON object, ...):
        only a change outside zmlx-pipeline puts one there, and every reader would fail on it or learn from it. One
        query over the rows."""
        where, params = _where(filters)
        checks = [c for _, c in _ROW_CHECKS if "?" not in c]  # not the clock: a stored time was checked when stored
        reasons = [r for r, c in _ROW_CHECKS if "?" not in c]
        case = " ".join(f"WHEN {c} THEN {i}" for i, c in enumerate(checks))
        fields = ("status", "median_us", "p10_us", "p90_us", "samples", "measured_at", "config", "shape")
        any_bad = f"{where} AND ({' OR '.join(f'({c})' for c in checks)})" if where else \
            f" WHERE {' OR '.join(f'({c})' for c in checks)}"
        found = self._conn.execute(
            f"SELECT device_id, kernel, dtype, {', '.join(fields)}, CASE {case} END FROM measurements{any_bad} LIMIT 1",
            params).fetchone()
        if found is None:
            return
        (count,) = self._conn.execute(f"SELECT count(*) FROM measurements{any_bad}", params).fetchone()
        device, kernel, dtype, *values, bad = found
        row = dict(zip(fields, values))
        raise self._bad_measurement((device, kernel, dtype, row["shape"], row["config"]), reasons[bad].format(**row),
                                    count, what)

    def _bad_measurement(self, key: Sequence[Any], reason: str, count: int, what: str = "read") -> CorruptStore:
        """The one-line CorruptStore of a stored measurement (device, kernel, dtype, shape, config) that a check
        refuses, and of how many rows share the reason."""
        device, kernel, dtype, shape, config = (printable(str(v)) for v in key)
        more = f" ({count - 1} more rows like it)" if count > 1 else ""
        return CorruptStore(
            f"store {self.path} holds a measurement no ingest would take ({device}, {kernel}, {dtype}, shape "
            f"{shape:.80}, config {config:.80}: {reason}){more}, so nothing was {what}: it was changed outside "
            "zmlx-pipeline; restore it from a copy, or delete those rows and ingest their shards again")

    def _measurements_sql(self, filters: dict[str, Any]) -> tuple[str, list[Any]]:
        """The filtered, ordered measurements query, after _check_stored of its rows."""
        self._check_stored(filters)
        where, params = _where(filters)
        sql = (
            f"SELECT {', '.join(MEASUREMENT_COLUMNS)} FROM measurements{where} "
            "ORDER BY device_id, kernel, kernel_version, dtype, shape_key, config_key"
        )
        return sql, params

    def measurements(self, **filters: Any) -> list[dict]:
        """Measurements as dicts (shape, config, extra parsed); filters: device, kernel, kernel_version, dtype, status, run_id."""
        sql, params = self._measurements_sql(filters)
        rows = _dicts(self._conn.execute(sql, params))
        for row in rows:
            row["extra"] = row["extra"] or {}
        return rows

    def measurements_arrow(self, **filters: Any):
        """Measurements as a pyarrow Table (shape, config, extra as JSON text); same filters as measurements(). The
        rows train, evaluate and publish learn from: each passes the checks export makes first (_check_read)."""
        sql, params = self._measurements_sql(filters)
        table = self._conn.sql(sql, params=params).to_arrow_table()
        self._check_read(table)
        return table

    def _check_read(self, table) -> None:
        """CorruptStore (one line, naming the row, the field and the fix) when a row of `table` (measurements_arrow's),
        or its device's row, fails a check export makes of every row it writes (_read_problem, _check_devices): a
        model must never learn from a row export refuses. Each check runs once per distinct value it reads."""
        if table.num_rows == 0:
            return
        import pyarrow.compute as pc

        ids = pc.unique(table["device_id"]).to_pylist()
        devices = {r["device_id"]: r for r in _dicts(self._conn.execute(
            f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices WHERE device_id IN ({', '.join('?' for _ in ids)})",
            ids), parse_json=False)}
        self._check_devices(devices.values())
        found = _read_problem(table, devices)
        if found is not None:
            row, reason, count = found
            key = [table[c][row].as_py() for c in ("device_id", "kernel", "dtype", "shape", "config")]
            raise self._bad_measurement(key, reason, count)

    def summary(self, device: str | None = None, kernel: str | None = None) -> list[dict]:
        """One row per (device, kernel, dtype): measurements, by_status, shapes, shapes_ok."""
        where, params = _where({"device": device, "kernel": kernel})
        return _summary_rows(self._conn.execute(_summary_sql("measurements", where), params))

    # -- models (registry) -------------------------------------------------------------------

    def add_model(self, row: dict) -> None:
        """Register one trained model (MODEL_COLUMNS; params, versions, scores as dicts); ids are unique."""
        self._require_writable("register a model")
        if not row.get("model_id"):
            raise StoreError("a model row needs a non-empty model_id")
        values = [_to_json(row.get(c)) if c in _MODEL_JSON else row.get(c) for c in MODEL_COLUMNS]
        if values[MODEL_COLUMNS.index("created_at")] is None:
            values[MODEL_COLUMNS.index("created_at")] = _now()
        try:
            with self._transaction() as con:
                con.execute(f"INSERT INTO models ({', '.join(MODEL_COLUMNS)}) "
                            f"VALUES ({', '.join('?' for _ in MODEL_COLUMNS)})", values)
        except duckdb.Error as err:
            raise StoreError(f"cannot register model {row['model_id']!r}: {_first_line(err)}") from err

    def models(self, kernel: str | None = None, model_id: str | None = None) -> list[dict]:
        """Registered models (of one kernel, or one id), newest first; params, versions, scores parsed."""
        clauses, params = [], []
        if kernel is not None:
            clauses.append("kernel_filter = ?")
            params.append(kernel)
        if model_id is not None:
            clauses.append("model_id = ?")
            params.append(model_id)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        cur = self._conn.execute(
            f"SELECT {', '.join(MODEL_COLUMNS)} FROM models{where} ORDER BY created_at DESC, model_id DESC", params)
        rows = _dicts(cur, parse_json=False)
        for row in rows:
            for col in _MODEL_JSON:
                row[col] = self._registry_json(row, col)
            if not isinstance(row["path"], str) or not row["path"]:
                raise self._bad_model(row, "it has no model file path")
        return rows

    def _registry_json(self, row: dict, column: str) -> Any:
        """A registry row's JSON column parsed: an object, or None; CorruptStore naming the model otherwise."""
        text = row[column]
        try:
            value = _from_json(text)
        except (ValueError, RecursionError):
            raise self._bad_model(row, f"its {column} column is not JSON ({text!r:.40})") from None
        if value is not None and not isinstance(value, dict):
            raise self._bad_model(row, f"its {column} column is not a JSON object ({text!r:.40})")
        return value

    def _bad_model(self, row: dict, what: str) -> CorruptStore:
        """CorruptStore naming a registry row only a change outside zmlx-pipeline could have written."""
        return CorruptStore(f"store {self.path}: registered model {row['model_id']}: {what}: the registry was changed "
                            "outside zmlx-pipeline; restore the store from a copy, or train the kernel again")

    # -- held-out cases of registered models --------------------------------------------------

    def add_heldout_cases(self, model_id: str, data_fingerprint: str, split: str, protocol: str, cases) -> int:
        """Record a model's held-out cases under one split and protocol (an Arrow table or polars frame with
        HELDOUT_CASE_COLUMNS), replacing any it had there; returns the rows stored."""
        self._require_writable("record held-out cases")
        import pyarrow as pa

        table = cases.to_arrow() if hasattr(cases, "to_arrow") else cases
        missing = [c for c in HELDOUT_CASE_COLUMNS if c not in table.column_names]
        if missing:
            raise StoreError(f"held-out cases of {model_id!r} lack column(s) {', '.join(missing)}")
        keys = (model_id, data_fingerprint, split, protocol)
        table = table.select(list(HELDOUT_CASE_COLUMNS))
        for name, value in reversed(list(zip(HELDOUT_KEY_COLUMNS, keys))):
            table = table.add_column(0, name, pa.array([value] * table.num_rows, pa.string()))
        columns = ", ".join((*HELDOUT_KEY_COLUMNS, *HELDOUT_CASE_COLUMNS))
        try:
            with self._transaction() as con:
                con.execute("DELETE FROM heldout_cases WHERE model_id = ? AND split = ? AND protocol = ?",
                            [model_id, split, protocol])
                con.register("_zmlx_heldout", table)
                try:
                    con.execute(f"INSERT INTO heldout_cases ({columns}) SELECT {columns} FROM _zmlx_heldout")
                finally:
                    con.unregister("_zmlx_heldout")
        except duckdb.Error as err:
            raise StoreError(f"cannot record held-out cases of {model_id!r}: {_first_line(err)}") from err
        return table.num_rows

    def heldout_cases(self, model_id: str, split: str, protocol: str):
        """A model's held-out cases under a split and protocol, as an Arrow table (HELDOUT_KEY_COLUMNS, then
        HELDOUT_CASE_COLUMNS), in case order; empty when none were recorded. Evaluate and publish report them as
        the model's scores, so a row train could not have written is refused first (_check_heldout)."""
        self._check_heldout(model_id, split, protocol)
        columns = ", ".join((*HELDOUT_KEY_COLUMNS, *HELDOUT_CASE_COLUMNS))
        return self._conn.sql(
            f"SELECT {columns} FROM heldout_cases WHERE model_id = ? AND split = ? AND protocol = ? "
            "ORDER BY method, device_id, kernel, dtype, shape_key", params=[model_id, split, protocol]).to_arrow_table()

    def _check_heldout(self, model_id: str, split: str, protocol: str) -> None:
        """CorruptStore (one line, naming the kernel, method and case, and the fix: train again) when a held-out case
        row of the model holds what train never records (_HELDOUT_CHECKS: a regret that is missing, not finite,
        below 1 or above the one of a smaller k, a hit_rank outside 1 to its case's configs): only a change outside
        zmlx-pipeline puts one there, and evaluate would print it as the model's regret. One query over the rows."""
        case = " ".join(f"WHEN {c} THEN {i}" for i, (_, c) in enumerate(_HELDOUT_CHECKS))
        fields = ("kernel", "method", "fold", "device_id", "dtype", "shape_key", *(f"r{k}" for k in HELDOUT_KS),
                  "hit_rank", "configs")
        found = self._conn.execute(
            f"SELECT {', '.join(fields)}, CASE {case} END, count(*) OVER () FROM heldout_cases WHERE model_id = ? "
            f"AND split = ? AND protocol = ? AND ({' OR '.join(f'({c})' for _, c in _HELDOUT_CHECKS)}) "
            "ORDER BY method, device_id, kernel, dtype, shape_key LIMIT 1", [model_id, split, protocol]).fetchone()
        if found is None:
            return
        row = dict(zip(fields, found))
        reason, count = _HELDOUT_CHECKS[found[-2]][0].format(**row), found[-1]
        more = f" ({count - 1} more rows like it)" if count > 1 else ""
        kernel = printable(str(row["kernel"]))
        raise CorruptStore(
            f"store {self.path} holds a held-out case train never records (model {printable(model_id)}, kernel "
            f"{kernel}, method {printable(str(row['method']))}, fold {printable(str(row['fold']))}, case "
            f"{printable(str(row['device_id']))} {printable(str(row['dtype']))} {row['shape_key']}: {reason}){more}, "
            f"so its scores were not read: it was changed outside zmlx-pipeline; train the kernel again "
            f"(`{shell_command('zmlx-pipeline', 'train', '--db', str(self.path), '-k', row['kernel'])}`), or restore "
            "the store from a copy")

    def heldout_count(self, model_id: str, split: str, protocol: str) -> int:
        """How many held-out case rows a model has under a split and protocol."""
        return self._conn.execute("SELECT count(*) FROM heldout_cases WHERE model_id = ? AND split = ? AND "
                                  "protocol = ?", [model_id, split, protocol]).fetchone()[0]

    # -- bundles -----------------------------------------------------------------------------

    def record_bundle(self, bundle_id: str, model_id: str | None, path: str, manifest: dict) -> None:
        """Record a published bundle (its manifest as JSON); publishing the same id again updates the row."""
        self._require_writable("record a bundle")
        created = manifest.get("created")
        try:
            created_at = datetime.fromisoformat(str(created).replace("Z", "+00:00"))
            if created_at.tzinfo is not None:  # the store keeps naive UTC
                created_at = created_at.astimezone(timezone.utc).replace(tzinfo=None)
        except ValueError:
            created_at = _now()
        try:
            with self._transaction() as con:
                con.execute(
                    "INSERT INTO bundles (bundle_id, model_id, created_at, path, manifest) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (bundle_id) DO UPDATE SET model_id = excluded.model_id, path = excluded.path, "
                    "manifest = excluded.manifest",
                    [bundle_id, model_id, created_at, path, canonical_json(manifest)],
                )
        except duckdb.Error as err:
            raise StoreError(f"cannot record bundle {bundle_id!r}: {_first_line(err)}") from err

    def bundles(self) -> list[dict]:
        """Published bundles, newest first, with the manifest parsed."""
        cur = self._conn.execute(
            "SELECT bundle_id, model_id, created_at, path, manifest FROM bundles ORDER BY created_at DESC, bundle_id DESC")
        rows = _dicts(cur, parse_json=False)
        for row in rows:
            row["manifest"] = _from_json(row["manifest"])
        return rows

    # -- shards ------------------------------------------------------------------------------

    def export_shard(self, path: str | os.PathLike, device: str | None = None) -> int:
        """Write measurements (of one device, or all) as one zstd Parquet shard, atomically; returns rows. A stored
        row ingest would refuse (a measurement, or its device's row: _check_devices) is a CorruptStore, one line."""
        target = Path(path)
        _check_shard_target(target, self.path)
        make_parent(target, "shard")
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        where, params = _where({"device": device}, prefix="m.")
        select = ", ".join(
            [f"m.{c}" for c in MEASUREMENT_COLUMNS]
            + [f"d.{c[len('device_'):]} AS {c}" for c in SHARD_DEVICE_COLUMNS]
            + [f"r.{c[len('run_'):]} AS {c}" for c in SHARD_RUN_COLUMNS]
            + ["rp.repeats AS repeats"]  # SHARD_COLUMNS' last
        )
        from zmlx_pipeline import __version__

        metadata = (
            f"KV_METADATA {{zmlx_pipeline_shard: {_sql_literal(SHARD_FORMAT)}, "
            f"schema_version: {_sql_literal(str(SCHEMA_VERSION))}, "
            f"pipeline_version: {_sql_literal(__version__)}}}"
        )
        sql = (
            f"COPY (SELECT {select} FROM measurements m "
            "LEFT JOIN devices d ON d.device_id = m.device_id "
            f"LEFT JOIN runs r ON r.run_id = m.run_id "
            # repeated timings of the key, as a JSON list, so a shard carries its noise data along
            "LEFT JOIN (SELECT device_id, kernel, kernel_version, dtype, shape_key, config_key, "
            "to_json(list({'run_id': run_id, 'median_us': median_us, 'measured_at': measured_at} "
            "ORDER BY measured_at))::VARCHAR AS repeats FROM repeats GROUP BY ALL) rp "
            f"ON {_same_key('rp', 'm')}{where} "
            "ORDER BY m.device_id, m.kernel, m.kernel_version, m.dtype, m.shape_key, m.config_key) "
            f"TO {_sql_literal(str(tmp))} (FORMAT parquet, COMPRESSION zstd, {metadata})"
        )
        self._check_stored({"device": device}, "exported")
        named, named_params = _where({"device": device})  # the devices rows the shard's device columns come from
        self._check_devices(_dicts(self._conn.execute(
            f"SELECT {', '.join(DEVICE_COLUMNS)} FROM devices WHERE device_id IN (SELECT device_id FROM "
            f"measurements{named}) ORDER BY device_id", named_params), parse_json=False), "exported")
        try:
            (rows,) = self._conn.execute(sql, params).fetchone()
            self._check_exported(tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            with commit_point():
                os.replace(tmp, target)
        except duckdb.Error as err:
            raise StoreError(f"cannot export a shard to {target}: {_first_line(err)}") from err
        except OSError as exc:
            raise StoreError(f"cannot export a shard to {target}: {exc.strerror or exc}") from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:  # a name too long to create was never created
                pass
        fsync_dir(target.parent)
        return int(rows)

    def _check_exported(self, shard: Path) -> None:
        """Refuse to export what ingest would refuse (so a shard always ingests again): the written file goes through
        ingest's own checks (shards.check_shard, then this module's, into an empty store in memory); StoreError
        naming the stored row and why, and nothing is written."""
        from zmlx_pipeline.data.shards import check_shard  # shards imports this module

        con = duckdb.connect()
        try:
            in_utc(con)
            for _version, _name, step in MIGRATIONS:
                step(con) if callable(step) else con.execute(step)
            check_shard(shard)
            columns = _shard_columns(con, shard)
            con.execute("CREATE TEMP TABLE _zmlx_shard AS SELECT * FROM read_parquet(?, file_row_number = true)",
                        [_one_file(shard)])
            _check_shard_rows(con, shard, columns)
        except BadShard as err:
            found = re.match(re.escape(str(shard)) + r", row (\d+): (.*); nothing was ingested", str(err))
            if found is None:
                raise StoreError(f"cannot export a shard of store {self.path}: {_first_line(err)}") from None
            key = con.execute("SELECT device_id, kernel, dtype, shape, config FROM read_parquet(?) LIMIT 1 OFFSET ?",
                              [_one_file(shard), int(found.group(1)) - 1]).fetchone()
            raise StoreError(
                f"cannot export a shard of store {self.path}: it holds a measurement no ingest would take ({', '.join(map(str, key))}: "
                f"{found.group(2)}), so nothing was exported: it was changed outside zmlx-pipeline; restore it from a "
                "copy, or delete those rows") from None
        finally:
            con.close()

    def ingest_shard(self, path: str | os.PathLike) -> dict:
        """Merge one shard in one transaction (idempotent); returns {'rows', 'added', 'skipped'}, and
        'replaced' when the shard re-measured keys the store had older timings of (the newest wins)."""
        return self.ingest_shards([path])["per_file"][str(Path(path))]

    def ingest_shards(self, paths: Sequence[str | os.PathLike]) -> dict:
        """Merge shards all or nothing: every row of every file is checked first (shards.check_shards, then the
        checks inside the transaction), and one transaction takes them all, so a bad file (named in the error with
        its row and reason) leaves the store as it was."""
        from zmlx_pipeline.data.shards import check_shards  # shards imports this module

        self._require_writable("ingest shards")
        shards = [Path(p) for p in paths]
        if not shards:
            raise BadShard("no shard to ingest: name .parquet files or directories holding them")
        for shard in shards:
            if not shard.is_file():
                raise BadShard(f"{shard}: no such shard file")
        check_shards(shards)
        return self._merge_shards(shards)

    def _merge_shards(self, shards: list[Path]) -> dict:
        """ingest_shards after shards.check_shards: the checks the store makes itself, in one transaction."""
        self._require_writable("ingest shards")
        per_file: dict[str, dict] = {}
        try:
            with self._transaction(final=True) as con:
                for shard in shards:
                    per_file[str(shard)] = self._ingest_one(con, shard)
        except duckdb.Error as err:
            raise BadShard(f"{shard} could not be ingested, the store is unchanged: {_first_line(err)}") from err
        totals = {"files": len(shards), "rows": 0, "added": 0, "skipped": 0, "replaced": 0, "per_file": per_file}
        for counts in per_file.values():
            for key in ("rows", "added", "skipped", "replaced"):
                totals[key] += counts.get(key, 0)
        return totals

    def _ingest_one(self, con: duckdb.DuckDBPyConnection, shard: Path) -> dict:
        """Check one shard's rows and merge them inside the caller's transaction."""
        columns = _shard_columns(con, shard)

        def col(name: str) -> str:
            """The shard's column, or NULL where an optional column is absent."""
            return name if name in columns else "NULL"

        device_cols = [c for c in DEVICE_COLUMNS if c != "device_id"]
        devices_sql = (
            f"INSERT INTO devices (device_id, {', '.join(device_cols)}) "
            f"SELECT device_id, {', '.join(f'any_value({col(s)})' for s in SHARD_DEVICE_COLUMNS)} "
            "FROM _zmlx_shard GROUP BY device_id "
            "ON CONFLICT (device_id) DO UPDATE SET "
            + ", ".join(f"{c} = coalesce(devices.{c}, excluded.{c})" for c in device_cols)
        )
        run_cols = [c for c in RUN_COLUMNS if c not in ("run_id", "device_id")]
        run_exprs = [
            f"coalesce(any_value({col('run_status')}), 'imported')" if c == "status" else f"any_value({col('run_' + c)})"
            for c in run_cols
        ]
        runs_sql = (
            f"INSERT INTO runs (run_id, device_id, {', '.join(run_cols)}) "
            f"SELECT run_id, any_value(device_id), {', '.join(run_exprs)} "
            "FROM _zmlx_shard GROUP BY run_id "
            "ON CONFLICT (run_id) DO UPDATE SET "
            "status = CASE WHEN runs.status = 'running' THEN excluded.status ELSE runs.status END, "
            "finished_at = coalesce(runs.finished_at, excluded.finished_at)"
        )
        # A key measured again (say, re-timed with another timer) keeps its newest timing, whichever
        # shard is ingested first.
        updated = [c for c in MEASUREMENT_COLUMNS if c not in _KEY_COLUMNS]
        measurements_sql = (
            f"INSERT INTO measurements ({', '.join(MEASUREMENT_COLUMNS)}) "
            f"SELECT {', '.join(col(c) for c in MEASUREMENT_COLUMNS)} FROM _zmlx_shard "
            f"ON CONFLICT ({', '.join(_KEY_COLUMNS)}) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in updated)
            + " WHERE excluded.measured_at > measurements.measured_at"
        )
        con.execute(
            "CREATE OR REPLACE TEMP TABLE _zmlx_shard AS SELECT * FROM read_parquet(?, file_row_number = true)",
            [_one_file(shard)],
        )
        try:
            _check_shard_rows(con, shard, columns)
            if "device_reported" in columns:
                self._check_registrations(con, shard)
            (rows,) = con.execute("SELECT count(*) FROM _zmlx_shard").fetchone()
            con.execute(devices_sql)
            con.execute(runs_sql)
            con.execute(_REPLACED_SQL)
            (replaced,) = con.execute("SELECT count(*) FROM _zmlx_replaced").fetchone()
            con.execute(_DROP_REPLACED_REPEATS_SQL)
            (changed,) = con.execute(measurements_sql).fetchone()  # inserted plus replaced
            if "repeats" in columns:
                con.execute(_INGEST_REPEATS_SQL)
        finally:
            with suppress(duckdb.Error):  # after a failed statement the rollback drops them
                con.execute("DROP TABLE IF EXISTS _zmlx_shard")
                con.execute("DROP TABLE IF EXISTS _zmlx_replaced")
        result = {"rows": int(rows), "added": int(changed) - int(replaced), "skipped": int(rows) - int(changed)}
        if replaced:
            result["replaced"] = int(replaced)
        return result

    def _check_registrations(self, con: duckdb.DuckDBPyConnection, shard: Path) -> None:
        """Refuse (BadShard, one line) a device the shard carries a registration record of (its device_reported's
        REGISTRATION) where the store holds that id registered with another record, and a new one `devices add` would
        refuse beside the catalog and the devices registered here (and by the shards ingested before it): a name or
        alias another device has. A record equal to the store's goes in as before."""
        found = con.execute("SELECT device_id, any_value(device_reported), min(file_row_number), count(*) "
                            "FROM _zmlx_shard WHERE device_reported IS NOT NULL GROUP BY device_id ORDER BY 3"
                            ).fetchall()
        registered = None  # the store's registered devices, read once for the shard
        for device_id, reported, first, count in found:
            record = _registration(reported)
            if record is None:
                continue
            stored = con.execute("SELECT in_catalog, reported FROM devices WHERE device_id = ?",
                                 [device_id]).fetchone()
            if stored is not None:
                held = _registration(stored[1]) if not stored[0] else None
                differs = None if held is None else _record_differs(held, record)
                if differs is None:
                    continue
                raise BadShard(bad_row(
                    shard, first, f"device {printable(str(device_id))!r} is registered with another record than store "
                    f"{self.path}'s{differs}: run `zmlx-pipeline devices add --replace RECORD` in one of the stores so "
                    "both hold one record, or register one of them under another id", int(count)))
            try:
                spec = DeviceSpec.from_json(record.get("device"))
                if spec.id != device_id:
                    raise CatalogError(f"its record is of device {spec.id!r}")
            except (CatalogError, AttributeError) as err:
                raise BadShard(bad_row(shard, first, f"device {printable(str(device_id))!r} carries a registration no "
                                       f"`devices add` would write ({_first_line(err)}): export the shard again from "
                                       "its store", int(count))) from None
            declared = record.get("sources")
            registered = self.registered_devices() if registered is None else registered
            others = tuple(s for s in registered if s.id != spec.id)
            problems = registration_problems(spec, declared if isinstance(declared, dict) else {}, others)
            if problems:
                raise BadShard(bad_row(shard, first, f"the device registration it carries cannot join store "
                                       f"{self.path}: {problems[0].text}; {problems[0].fix} (`devices add --replace` "
                                       "in the store it came from, then export it again)", int(count)))


# Row checks of an incoming shard: (reason, SQL condition that is true for a bad row). Clock skew
# between a collecting machine and this one is allowed for up to FUTURE_SKEW.
FUTURE_SKEW = timedelta(hours=1)
#: the earliest measured_at a row may hold: before any run of this tool (0001-01-01 is a zeroed or made-up time)
MEASURED_FLOOR = "2000-01-01"
#: how long before its run's run_started_at a row may say it was timed: a row is timed during its run, and one
#: clock stamps both; a day leaves room for that clock being set during a run (NTP, a laptop's time zone)
RUN_START_SKEW = timedelta(days=1)
#: why a row's measured_at is refused, for a shard's row (_ROW_CHECKS) and a row recorded (measured_at_problem) alike
_IN_THE_FUTURE = "measured_at {measured_at} is in the future"
_BEFORE_THE_FLOOR = f"measured_at {{measured_at}} is before {MEASURED_FLOOR}, earlier than any timing this tool made"


def measured_at_problem(when: datetime, now: datetime | None = None) -> str | None:
    """Why a row may not say it was timed at `when` (naive UTC), as a shard's row check says it: later than now (with
    FUTURE_SKEW for another machine's clock) or before MEASURED_FLOOR; None when it may."""
    now = _now() if now is None else now
    if when > now + FUTURE_SKEW:
        return _IN_THE_FUTURE.format(measured_at=when)
    if when < datetime.fromisoformat(MEASURED_FLOOR):
        return _BEFORE_THE_FLOOR.format(measured_at=when)
    return None


_ROW_CHECKS = (
    ("unknown status {status!r} (expected one of " + ", ".join(STATUSES) + ")",
     "status IS NULL OR status NOT IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")"),
    ("an ok row needs a finite positive median_us, not {median_us!r}",
     "status = 'ok' AND (median_us IS NULL OR NOT isfinite(median_us) OR median_us <= 0)"),
    ("p10_us / p90_us must be finite and positive when given, not {p10_us!r} / {p90_us!r}",
     "(p10_us IS NOT NULL AND (NOT isfinite(p10_us) OR p10_us <= 0)) "
     "OR (p90_us IS NOT NULL AND (NOT isfinite(p90_us) OR p90_us <= 0))"),
    ("a timing must be non-negative, not {median_us!r}",
     "median_us IS NOT NULL AND (isnan(median_us) OR median_us < 0)"),
    ("samples must be a whole number from 0 to 2147483647, not {samples!r}",
     "samples IS NULL OR NOT isfinite(samples::DOUBLE) OR samples < 0 OR samples > 2147483647 "
     "OR samples::DOUBLE <> floor(samples::DOUBLE)"),
    ("measured_at is missing (every row says when it was timed)", "measured_at IS NULL"),
    (_IN_THE_FUTURE, "measured_at > ?"),
    (_BEFORE_THE_FLOOR, f"measured_at < TIMESTAMP '{MEASURED_FLOOR}'"),
    ("config is not a JSON object: {config!r}",
     "config IS NULL OR NOT json_valid(config) OR json_type(config) <> 'OBJECT'"),
    ("shape is not a JSON object: {shape!r}",
     "shape IS NULL OR NOT json_valid(shape) OR json_type(shape) <> 'OBJECT'"),
)


# Names a row is stored under: (reason, SQL condition true for a bad one), each over the shard's distinct values.
_NAME_CHECKS = (
    *((f"{name} {{value}} is longer than {MAX_NAME_LENGTH} characters, the most a name may hold", name,
       f"length({name}) > {MAX_NAME_LENGTH}")  # records.name_problem
      for name in ("device_id", "run_id", "kernel", "kernel_version", "dtype")),
    ("device_id {value} is not a device id (lower-case letters and digits joined by single hyphens, and an "
     "optional core limit like @66sm, as the catalog writes them)",  # records.device_id_problem
     "device_id", f"NOT regexp_full_match(device_id, '{DEVICE_ID_PATTERN}')"),
    *((f"{name} {{value}} starts or ends with white space or holds a control character", name,
       f"regexp_matches({name}, '^\\s|\\s$|[\\x00-\\x1f\\x7f]')")
      for name in ("run_id", "kernel", "kernel_version", "dtype")),
)
def _check_names(con: duckdb.DuckDBPyConnection, shard: Path) -> None:
    """Refuse names the product never writes (BadShard naming the file, first row and the name): a device id not
    in the catalog's form, a name with white space at an end or a control character, and a kernel that differs
    from another (stored, or in this shard) only as records.fold_name folds (case, white space, NFKC)."""
    for reason, column, condition in _NAME_CHECKS:
        found = con.execute(
            f"SELECT {column}, min(file_row_number), sum(count(*)) OVER () FROM _zmlx_shard WHERE {column} IS NOT NULL "
            f"AND {condition} GROUP BY 1 ORDER BY 2 LIMIT 1").fetchone()
        if found:
            raise BadShard(bad_row(shard, found[1], reason.format(value=shortened(found[0])), int(found[2])))
    # folded here, not in SQL: DuckDB has no NFKC; the distinct kernels of a store are few
    incoming = con.execute("SELECT kernel, min(file_row_number), count(*) FROM _zmlx_shard WHERE kernel IS NOT NULL "
                           "GROUP BY 1 ORDER BY 2").fetchall()
    known = sorted(k for (k,) in con.execute("SELECT DISTINCT kernel FROM measurements").fetchall())
    by_fold: dict[str, list[str]] = {}
    for name in [*known, *(k for k, _, _ in incoming)]:
        by_fold.setdefault(fold_name(name), []).append(name)
    for kernel, first, count in incoming:
        problem = twin_problem("kernel", kernel, by_fold[fold_name(kernel)])
        if problem is not None:
            raise BadShard(bad_row(shard, first, problem, int(count)))


def _check_whole_numbers(con: duckdb.DuckDBPyConnection, shard: Path, columns: dict[str, str]) -> None:
    """Refuse a fractional value (or NaN, inf) in a shard column stored as a whole number: it would be rounded."""
    for name, stored in _shard_column_types().items():
        if stored in ("INTEGER", "BIGINT") and columns.get(name, "").split("(")[0] in _FRACTIONAL + ("DECIMAL",):
            found = con.execute(
                f"SELECT {name}, file_row_number, count(*) OVER () FROM _zmlx_shard WHERE {name} IS NOT NULL AND "
                f"(NOT isfinite({name}::DOUBLE) OR {name}::DOUBLE <> floor({name}::DOUBLE)) ORDER BY 2 LIMIT 1"
            ).fetchone()
            if found:
                raise BadShard(bad_row(shard, found[1], f"{name} must be a whole number, not {found[0]!r}", found[2]))


def _check_shard_rows(con: duckdb.DuckDBPyConnection, shard: Path, columns: dict[str, str] | None = None) -> None:
    """Refuse a shard holding a row the store must not take: BadShard names the file, the row and why."""
    _check_names(con, shard)
    _check_whole_numbers(con, shard, columns or {})
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    fields = ("file_row_number", "status", "median_us", "p10_us", "p90_us", "samples", "measured_at", "config", "shape")
    for reason, condition in _ROW_CHECKS:
        params = [now + FUTURE_SKEW] if "?" in condition else []
        found = con.execute(
            f"SELECT {', '.join(fields)}, count(*) OVER () FROM _zmlx_shard WHERE {condition} "
            "ORDER BY file_row_number LIMIT 1", params
        ).fetchone()
        if found:
            row = dict(zip(fields, found))
            raise BadShard(bad_row(shard, row["file_row_number"], reason.format(**row), found[-1]))
    if "run_started_at" in (columns or {}):
        found = con.execute(
            "SELECT file_row_number, measured_at, run_started_at, count(*) OVER () FROM _zmlx_shard "
            "WHERE measured_at < run_started_at - ? ORDER BY file_row_number LIMIT 1", [RUN_START_SKEW]).fetchone()
        if found:
            raise BadShard(bad_row(shard, found[0], f"measured_at {found[1]} is before its run started "
                                                    f"(run_started_at {found[2]}; a row is timed during its run)",
                                   found[-1]))
    # Keys must be the canonical hash of what they name, or two timings of one config would pass as two.
    for column, key_column in (("config", "config_key"), ("shape", "shape_key")):
        pairs = con.execute(
            f"SELECT {column}, {key_column}, min(file_row_number), count(*) FROM _zmlx_shard GROUP BY 1, 2"
        ).fetchall()
        for text, key, first_row, count in pairs:
            if mapping_key(json.loads(text)) != key:
                raise BadShard(bad_row(shard, first_row, f"{key_column} {key!r} is not the key of {column} {text}", count))
    # Every config of one kernel version names the same parameters (as does the store's).
    sets = con.execute(
        "SELECT kernel, kernel_version, list_sort(json_keys(config::JSON)) AS params, min(file_row_number), count(*) "
        "FROM _zmlx_shard GROUP BY ALL ORDER BY 4"
    ).fetchall()
    first: dict[tuple[str, str], tuple[list[str], int]] = {}
    for kernel, version, params, first_row, count in sets:
        stored = con.execute(
            "SELECT list_sort(json_keys(config::JSON)) FROM measurements WHERE kernel = ? AND kernel_version = ? LIMIT 1",
            [kernel, version],
        ).fetchone()
        expected = (stored[0], None) if stored else first.setdefault((kernel, version), (params, first_row))
        if list(params) != list(expected[0]):
            raise BadShard(bad_row(
                shard, first_row,
                f"{kernel} ({version}) config names parameters {list(params)}, but its other configs name "
                f"{list(expected[0])}", count))
    _check_same_time_conflicts(con, shard)


# What a timing found: two rows of one key and one measured_at must agree on these, since neither is newer.
_RESULT_COLUMNS = ("status", "median_us", "p10_us", "p90_us", "samples")


def _check_same_time_conflicts(con: duckdb.DuckDBPyConnection, shard: Path) -> None:
    """Refuse a row timed at the same moment as a stored or an earlier row of its key with another result:
    the newest timing of a key wins, and of two at one time neither is newer, so one would be dropped
    without a word. Rows that repeat a stored one exactly are the idempotent re-ingest, and pass."""
    differs = " OR ".join(f"a.{c} IS DISTINCT FROM b.{c}" for c in _RESULT_COLUMNS)
    where = f"{_same_key('a', 'b')} AND a.measured_at = b.measured_at AND ({differs})"
    stored = con.execute(
        f"SELECT a.file_row_number, a.device_id, a.measured_at, a.status, a.median_us, b.status, b.median_us, "
        f"count(*) OVER () FROM _zmlx_shard a JOIN measurements b ON {where} ORDER BY 1 LIMIT 1"
    ).fetchone()
    if stored:
        row, device, at, status, median, was_status, was_median, count = stored
        raise BadShard(bad_row(
            shard, row, f"{device} timed this config and shape at {at} already, with another result "
            f"({status} {_us(median)}; stored: {was_status} {_us(was_median)}), and of two timings at one time "
            "neither replaces the other", count))
    within = con.execute(
        f"SELECT a.file_row_number, min(b.file_row_number), a.status, a.median_us, count(*) OVER () "
        f"FROM _zmlx_shard a JOIN _zmlx_shard b ON {where} AND b.file_row_number < a.file_row_number "
        "GROUP BY ALL ORDER BY 1 LIMIT 1"
    ).fetchone()
    if within:
        row, first, status, median, count = within
        raise BadShard(bad_row(
            shard, row, f"same device, config, shape and time as row {int(first) + 1} with another result "
            f"({status} {_us(median)}), and of two timings at one time neither replaces the other", count))


def _us(median: float | None) -> str:
    return "no time" if median is None else f"{median:.6g} us"


def bad_row(shard: Path, row: int, reason: str, count: int) -> str:
    """One line: which file and row, why, how many rows share the problem, and that nothing went in."""
    more = f" ({count - 1} more rows like it)" if count > 1 else ""
    return f"{shard}, row {int(row) + 1}: {reason}{more}; nothing was ingested, the store is unchanged"


# --------------------------------------------------------------------------------------------
# The checks of stored rows that are read to learn from: export's checks of a shard's rows (shards.py's _CHECKS
# and _ROW_CHECKS, then the keys and parameter names _check_shard_rows checks), over a measurements table read
# from the store and the devices rows it names, so that train, evaluate and publish never take a row export
# refuses. A devices row is a shard's device_* columns; a run's columns are not read, and so not checked.

_SHARD_DEVICE_SET = frozenset(SHARD_DEVICE_COLUMNS)
_SHARD_RUN_SET = frozenset(SHARD_RUN_COLUMNS)


def _is_device_check(columns: Sequence[str]) -> bool:
    """A shard check of the device's own columns (with its id, and the run's, given as None here)."""
    return (any(c in _SHARD_DEVICE_SET for c in columns)
            and all(c == "device_id" or c in _SHARD_DEVICE_SET or c in _SHARD_RUN_SET for c in columns))


def _store_words(reason: str) -> str:
    """A shard check's reason in the store's words: devices columns by their own names (memory_bandwidth_gbps, not
    device_memory_bandwidth_gbps), without the advice on writing a shard."""
    reason = reason.split("; a shard of a catalog device")[0]
    return re.sub(r"\bdevice_(" + "|".join(c[len("device_"):] for c in SHARD_DEVICE_COLUMNS) + r")\b", r"\1",
                  printable(reason))


#: the key of a registered device's record in its `reported` object (Store.register_device)
REGISTRATION = "registration"


def _registration(reported: Any) -> dict | None:
    """The record a `reported` object (stored JSON text) holds under REGISTRATION, or None."""
    try:
        value = json.loads(reported) if isinstance(reported, str) else None
    except (ValueError, RecursionError):
        return None
    record = value.get(REGISTRATION) if isinstance(value, dict) else None
    return record if isinstance(record, dict) else None


def _record_differs(held: dict, record: dict) -> str | None:
    """None when two registration records register the same device (when each was registered does not count), else
    the words naming the device fields that differ (` (memory_bandwidth_gbps differs)`, or empty), for a refusal."""
    if ({k: v for k, v in held.items() if k != "registered_at"}
            == json.loads(json.dumps({k: v for k, v in record.items() if k != "registered_at"}))):
        return None
    mine, theirs = (r.get("device") if isinstance(r.get("device"), dict) else {} for r in (held, record))
    fields = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
    return f" ({', '.join(fields)} {'differs' if len(fields) == 1 else 'differ'})" if fields else ""


def device_row_problem(row: dict) -> str | None:
    """Why a `devices` row (its columns, `reported` as JSON text) could not come from a shard ingest takes (the device
    checks of shards.py), in the store's words; None when it passes."""
    return _device_problem(row)


def _device_problem(row: dict) -> str | None:
    """Why a devices row (its columns, `reported` as stored text) could not come from a shard ingest takes: the
    device checks of shards.py (figures, JSON, the catalog's figures of a catalog chip, the catalog's vendors, backends
    and core units, a core limit's core_limited_from); None when it passes."""
    from zmlx_pipeline.data import shards  # shards imports this module

    values = {"device_id": row.get("device_id"), **{f"device_{c}": row.get(c) for c in DEVICE_COLUMNS}}
    for columns, check in shards._CHECKS:
        if _is_device_check(columns):
            problem = check(*(values.get(c) for c in columns))
            if problem is not None:
                return _store_words(problem)
    return None


def _dim_names(shape: Any) -> Any:
    """A shape's dim names (sorted), or the text itself when it is no JSON object."""
    try:
        value = json.loads(shape)
    except (TypeError, ValueError, RecursionError):
        return shape
    return tuple(sorted(value)) if isinstance(value, dict) else shape


def _read_problem(table, devices: dict[str, dict]) -> tuple[int, str, int] | None:
    """(first row, reason, rows sharing it) of the first check of a shard's row that a row of `table` (measurement
    columns, as measurements_arrow reads them) fails, or None. A check that also reads device columns takes them from
    `devices` (devices rows by id, unparsed); every check runs once per distinct set of the values it reads."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from zmlx_pipeline.data import shards  # shards imports this module

    held = set(table.column_names)
    ids = pc.unique(table["device_id"]).to_pylist()
    # checks that read a column only through a part of its value, judged once per part: a built-in kernel's
    # constraints see a dtype's size (dtype_bytes), and its dims and parameters check sees a shape's dim names
    standins: dict[Callable, dict[str, Callable[[Any], Any]]] = {
        shards._legal: {"dtype": lambda dtype: DTYPE_BYTES.get(dtype, dtype)},
        shards._builtin: {"shape": _dim_names},
    }

    def first(work, names: list[str], bad: dict) -> tuple[int, str, int]:
        rows = [shards._key(k) for k in zip(*(work[c].to_pylist() for c in names))]
        found = [i for i, k in enumerate(rows) if k in bad]
        return found[0], _store_words(bad[rows[found[0]]]), len(found)

    for columns, check in shards._CHECKS:
        own = [c for c in columns if c in held]
        device = [c for c in columns if c in _SHARD_DEVICE_SET]
        if not own or _is_device_check(columns) or len(own) + len(device) < len(columns):
            continue  # the devices row's own (_device_problem), or a column a store read has not (repeats)
        work, names = table.select(own), list(own)
        for column, part in standins.get(check, {}).items():  # one value of each part stands for the others
            if column in own:
                found = pc.unique(table[column]).to_pylist()
                first_of: dict[Any, str] = {}
                standing = [first_of.setdefault(part(v), v) for v in found]
                at = pc.index_in(table[column], value_set=pa.array(found, pa.string()))
                work = work.set_column(own.index(column), column, pc.take(pa.array(standing, pa.string()), at))
        values: list[tuple] = [()]
        if device:  # the device's values, as one group number per distinct set of them
            groups: dict[tuple, int] = {}
            number = [groups.setdefault(tuple((devices.get(d) or {}).get(c[len("device_"):]) for c in device),
                                        len(groups)) for d in ids]
            at = pc.index_in(table["device_id"], value_set=pa.array(ids, pa.string()))
            work, names = work.append_column("_device", pc.take(pa.array(number, pa.int64()), at)), own + ["_device"]
            values = list(groups)
        distinct = work.group_by(names, use_threads=False).aggregate([])
        keys = zip(*(distinct[c].to_pylist() for c in names))
        if list(columns) == own + device:  # the usual order: the row's own values, then its device's
            verdicts = ((key, check(*key[:len(own)], *values[key[-1] if device else 0])) for key in keys)
        else:
            where = [(0, own.index(c)) if c in own else (1, device.index(c)) for c in columns]
            verdicts = ((key, check(*[key[i] if side == 0 else values[key[-1]][i] for side, i in where]))
                        for key in keys)
        bad = {shards._key(key): reason for key, reason in verdicts if reason is not None}
        if bad:
            return first(work, names, bad)
    for columns, marks, reason in shards._ROW_CHECKS:
        if set(columns) <= held:
            found = pc.indices_nonzero(pc.fill_null(marks(table), False))
            if len(found):
                row = found[0].as_py()
                return row, _store_words(reason(*(table[c][row].as_py() for c in columns))), len(found)
    # a key is the hash of what it names, or two timings of one config would pass as two (_check_shard_rows)
    for column, key_column in (("config", "config_key"), ("shape", "shape_key")):
        pairs = table.select([column, key_column]).group_by([column, key_column], use_threads=False).aggregate([])
        bad = {(text, key): f"{key_column} {key!r} is not the key of {column} {text}"
               for text, key in zip(pairs[column].to_pylist(), pairs[key_column].to_pylist())
               if mapping_key(json.loads(text)) != key}
        if bad:
            return first(table, [column, key_column], bad)
    # every config of one kernel version names the same parameters (_check_shard_rows); the odd ones out are those
    # of fewer rows
    names = ["kernel", "kernel_version", "config"]
    configs = table.select(names).group_by(names, use_threads=False).aggregate([([], "count_all")])
    named: dict[tuple[str, str], dict[tuple[str, ...], int]] = {}
    of: dict[tuple[str, str, str], tuple[str, ...]] = {}
    for kernel, version, text, count in zip(*(configs[c].to_pylist() for c in [*names, "count_all"])):
        params = of[(kernel, version, text)] = tuple(sorted(json.loads(text)))
        seen = named.setdefault((kernel, version), {})
        seen[params] = seen.get(params, 0) + count
    for (kernel, version), seen in named.items():
        if len(seen) > 1:
            usual = max(seen, key=lambda p: (seen[p], p))
            bad = {key: f"{kernel} ({version}) config names parameters {list(params)}, but its other configs name "
                        f"{list(usual)}"
                   for key, params in of.items() if key[:2] == (kernel, version) and params != usual}
            return first(table, names, bad)
    return None


_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
             "UHUGEINT")
_FRACTIONAL = ("FLOAT", "DOUBLE")
# what a shard column of each stored type may be read from ('"NULL"': a column of nulls only): any number for
# a number (a fractional one for a whole-number column is checked to hold whole numbers), any timestamp for a
# timestamp (one with a time zone is converted to UTC; not a date), and only text for text
_SHARD_TYPES = {
    "VARCHAR": ("text", ("VARCHAR",)),
    # not FLOAT: a 32-bit float holds 1.728 as 1.7280000448..., no longer between the row's other timings
    "DOUBLE": ("a number", _INTEGERS + ("DOUBLE", "DECIMAL")),
    "INTEGER": ("a whole number", _INTEGERS + _FRACTIONAL + ("DECIMAL",)),
    "BIGINT": ("a whole number", _INTEGERS + _FRACTIONAL + ("DECIMAL",)),
    "BOOLEAN": ("a boolean", ("BOOLEAN",)),
    # not DATE: a day is no time of day, and would be stored as its midnight (before the run that timed it)
    "TIMESTAMP": ("a timestamp", ("TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
                                  "TIMESTAMP WITH TIME ZONE")),
}


#: (a shard column's type, the stored type): how to write such a column so that it is taken
_TYPE_FIXES = {("FLOAT", "DOUBLE"): "write it as float64 (a 32-bit float changes the value), or re-export it with "
                                   "zmlx-pipeline export"}


def _shard_column_types() -> dict[str, str]:
    """The stored type of each shard column (SHARD_COLUMNS), from the schema the migrations make."""
    tables = {t: dict(c) for t, c in _schema_history(tuple(MIGRATIONS))[-1][1].items()}
    types = {c: tables["measurements"][c] for c in MEASUREMENT_COLUMNS}
    types.update({c: tables["devices"][c[len("device_"):]] for c in SHARD_DEVICE_COLUMNS})
    types.update({c: tables["runs"][c[len("run_"):]] for c in SHARD_RUN_COLUMNS})
    types["repeats"] = "VARCHAR"
    return types


def _not_a_shard_hint(shard: Path) -> str:
    """What to do with a file ingest cannot read: a Kernel Tuner or KTT file (JSON, gzip) goes in through import, a
    Git LFS pointer needs fetching; anything else, re-export it."""
    try:
        with open(shard, "rb") as fh:
            head = fh.read(64)
    except OSError:
        head = b""
    if head.startswith(GIT_LFS_POINTER.encode()):
        return "it is a Git LFS pointer, not the shard: fetch it with `git lfs pull` in its repository"
    gzipped = head.startswith(b"\x1f\x8b")
    if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"[") or gzipped:
        command = shell_command("zmlx-pipeline", "import", str(shard))
        return (f"it looks like {'gzip' if gzipped else 'JSON'}: a Kernel Tuner or KTT file goes in with `{command}` "
                "(with --device where it names no GPU)")
    return "re-export it"


def _shard_columns(con: duckdb.DuckDBPyConnection, shard: Path) -> dict[str, str]:
    """The shard's columns and their DuckDB types; BadShard (one line) if it is not readable Parquet, names a column
    twice, lacks required columns, or has a shard column of a type its values cannot be stored as."""
    problem = utf8_problem(shard, "shard")
    if problem is not None:
        raise BadShard(f"{problem}; nothing was ingested, the store is unchanged")
    try:
        described = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [_one_file(shard)]).fetchall()
    except duckdb.Error as err:
        raise BadShard(f"{shard} is not a readable Parquet shard ({_first_line(err, shard)}): "
                       f"{_not_a_shard_hint(shard)}") from err
    import pyarrow.parquet as pq

    try:  # DuckDB renames a second column of one name (median_us_1), so it would be read as another column
        schema = pq.read_schema(shard)
        names, metadata = schema.names, schema.metadata or {}
    except Exception:  # noqa: BLE001 - DuckDB read it; only the names and versions are wanted here
        names, metadata = [], {}
    _check_shard_versions(shard, metadata)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BadShard(f"{shard} has more than one column named {', '.join(twice)}: a shard names each column once; "
                       "re-export it with zmlx-pipeline export; nothing was ingested, the store is unchanged")
    columns = {r[0]: r[1] for r in described}
    missing = [c for c in SHARD_REQUIRED if c not in columns]
    if missing:
        raise BadShard(f"{shard} is missing shard columns {', '.join(missing)}: re-export it with zmlx-pipeline export")
    for name, stored in _shard_column_types().items():
        found = columns.get(name)
        if found is None or found == '"NULL"':
            continue
        what, allowed = _SHARD_TYPES[stored]
        if found.split("(")[0] not in allowed:
            fix = _TYPE_FIXES.get((found, stored), "re-export it with zmlx-pipeline export")
            raise BadShard(f"{shard}: column {name} is {found}, but a shard's {name} is {what} ({stored}): {fix}; "
                           "nothing was ingested, the store is unchanged")
    return columns


#: the versions export writes in a shard's key-value metadata (each a whole number as text), and what each counts
_SHARD_VERSIONS = {b"zmlx_pipeline_shard": (SHARD_FORMAT, "shard format"), b"schema_version": (str(SCHEMA_VERSION),
                                                                                               "store schema")}


def _check_shard_versions(shard: Path, metadata: dict) -> None:
    """BadShard (one line) for a shard whose metadata says a version this code does not write: a newer one (its rows
    may mean what this code cannot tell) or one that is no whole number; a shard without them (written by another
    tool) is judged by its columns alone."""
    for key, (ours, what) in _SHARD_VERSIONS.items():
        if key not in metadata:
            continue
        given = metadata[key].decode("utf-8", "replace")
        if not re.fullmatch(r"[1-9][0-9]{0,8}", given):
            raise BadShard(f"{shard}: its metadata gives {key.decode()} {shortened(given)}, not a version (a whole "
                           "number from 1): re-export it with zmlx-pipeline export; nothing was ingested, the store is "
                           "unchanged")
        if int(given) > int(ours):
            raise BadShard(f"{shard} was written by a newer zmlx-pipeline ({what} {given}; this one reads up to "
                           f"{ours}): upgrade zmlx-pipeline to ingest it; nothing was ingested, the store is unchanged")


_SCRATCH: list[duckdb.DuckDBPyConnection] = []


def check_shard_columns(shard: str | os.PathLike) -> dict[str, str]:
    """The shard's columns and types, refused as the store's ingest refuses them (BadShard, one line), read
    without a store."""
    if not _SCRATCH:
        _SCRATCH.append(in_utc(duckdb.connect()))
    con = _SCRATCH[0].cursor()
    try:
        return _shard_columns(con, Path(shard))
    finally:
        con.close()


#: characters DuckDB's file readers take as a glob pattern (`h200[1].parquet` would read `h2001.parquet`)
_GLOB_CHARS = re.compile(r"([\[\]*?{}])")


def _one_file(path: str | os.PathLike) -> str:
    """A path as DuckDB's read_parquet reads that one file: each glob character in a one-character class."""
    return _GLOB_CHARS.sub(r"[\1]", str(path))


def query_shards(directory: str | os.PathLike, device: str | None = None, kernel: str | None = None) -> list[dict]:
    """Summary (same rows as Store.summary) over a directory of shards, read in place."""
    source = Path(directory)
    if source.is_dir():
        pattern = os.path.join(_one_file(source), "*.parquet")
    else:  # a file that exists is that file; a name of none may be a pattern (shards/*-h200.parquet)
        pattern = _one_file(source) if source.exists() else str(source)
    if not source.is_dir() and not any(ch in pattern for ch in "*?[") and not source.exists():
        raise BadShard(f"{source}: no such shard directory or file")
    where, params = _where({"device": device, "kernel": kernel})
    con = duckdb.connect()
    try:
        try:
            if not con.execute("SELECT count(*) FROM glob(?)", [pattern]).fetchone()[0]:
                return []
            cur = con.execute(
                _summary_sql("read_parquet(?, union_by_name = true)", where), [pattern, *params]
            )
            return _summary_rows(cur)
        except duckdb.Error as err:
            raise BadShard(f"cannot read shards {pattern}: {_first_line(err)}") from err
    finally:
        con.close()
