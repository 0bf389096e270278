"""Throughput of detectors/codec.py on real-shaped `__transaction_state` values (one thread, best of N).

`python -m benchmarks.bench_codec [--records N] [--repeat R]` prints a table and one JSON line; it compares
kafka-python's generic schema engine, fed Kafka's own schema from the broker jar (`make jars`), on the same bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.jars import jars_dir
from detectors.codec import TxnLogValue, TxnStatus, decode_value, decode_values, encode_value

TOPICS = ["orders", "payments-eu", "inventory.events", "clickstream-v2", "billing", "shipments.dlq"]
NOW_MS = 1_732_000_000_000
LIFECYCLE = (TxnStatus.EMPTY, TxnStatus.ONGOING, TxnStatus.PREPARE_COMMIT, TxnStatus.COMPLETE_COMMIT)


def _partitions(rng: random.Random) -> tuple[tuple[str, tuple[int, ...]], ...]:
    topics = rng.sample(TOPICS, rng.randint(1, 3))
    return tuple((t, tuple(sorted(rng.sample(range(64), rng.randint(1, 4))))) for t in topics)


def ongoing_tv2(rng: random.Random) -> TxnLogValue:
    """The shape the job sees most: Ongoing, 1-3 topics x 1-4 partitions, ClientTransactionVersion 2."""
    start = NOW_MS - rng.randint(0, 60_000)
    return TxnLogValue(1, rng.randint(0, 2**40), rng.randint(0, 50), 60_000, TxnStatus.ONGOING, _partitions(rng),
                       start + rng.randint(0, 5_000), start, client_transaction_version=2)  # fmt: skip


def kafka43_lifecycle(rng: random.Random) -> TxnLogValue:
    """What a 4.3 broker writes (see tests/unit/resources): every state, PreviousProducerId (tag 0) always set."""
    status = rng.choice(LIFECYCLE)
    pid = rng.randint(0, 2**40)
    parts = (
        None if status is TxnStatus.EMPTY else () if status is TxnStatus.COMPLETE_COMMIT else _partitions(rng)
    )
    start = -1 if status is TxnStatus.EMPTY else NOW_MS - rng.randint(0, 60_000)
    return TxnLogValue(1, pid, rng.randint(0, 50), 60_000, status, parts, NOW_MS, start, previous_producer_id=pid,
                       client_transaction_version=rng.choice((0, 2)))  # fmt: skip


def ongoing_v0(rng: random.Random) -> TxnLogValue:
    """Ongoing as a transaction.version=0 cluster writes it (non-flexible v0)."""
    start = NOW_MS - rng.randint(0, 60_000)
    return TxnLogValue(0, rng.randint(0, 2**40), rng.randint(0, 50), 60_000, TxnStatus.ONGOING, _partitions(rng),
                       start + rng.randint(0, 5_000), start)  # fmt: skip


DATASETS: dict[str, Callable[[random.Random], TxnLogValue]] = {
    "v1 Ongoing TV2": ongoing_tv2,
    "v1 Kafka 4.3 lifecycle": kafka43_lifecycle,
    "v0 Ongoing": ongoing_v0,
}


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def best_rate(
    run: Callable[[Sequence[bytes]], Any], values: Sequence[bytes], repeat: int, clock: Callable[[], float]
) -> float:
    """Records/s of the fastest of `repeat` passes over `values`."""
    best = float("inf")
    for _ in range(repeat):
        started = clock()
        run(values)
        best = min(best, clock() - started)
    return len(values) / best


def loop_decode(values: Sequence[bytes]) -> None:
    for data in values:
        decode_value(data)


def _schemas_from_kafka_jar() -> Path:
    """Kafka's own TransactionLogValue.json, read from the broker jar `make jars` fetched (never copied into the
    repository), in a fresh folder importable as a package (kafka-python's load_json reads through importlib)."""
    jars = sorted((jars_dir() / "kafka").glob("kafka-transaction-coordinator-*.jar"))
    if not jars:
        raise OSError("no kafka-transaction-coordinator jar: run `make jars`")
    package = Path(tempfile.mkdtemp(prefix="txnwatch-bench-schemas-"))
    with zipfile.ZipFile(jars[-1]) as jar:
        for file in ("TransactionLogKey.json", "TransactionLogValue.json"):
            (package / file).write_bytes(jar.read(f"common/message/{file}"))
    (package / "__init__.py").write_text("")
    return package


def generic_engine() -> dict[str, Callable[[Sequence[bytes]], None]]:
    """kafka-python's generic engine on Kafka's TransactionLogValue.json: public `decode` and compiled decoders."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from kafka.protocol.api_data import ApiData

            name = (
                "txnwatch_bench_schemas"  # load_json reads through importlib.resources: import as a package
            )
            schemas = _schemas_from_kafka_jar()
            spec = importlib.util.spec_from_file_location(
                name, schemas / "__init__.py", submodule_search_locations=[str(schemas)]
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)

            def patch(cls: type, schema: dict[str, Any]) -> dict[str, Any]:
                schema["type"] = "data"
                for field in schema["fields"]:
                    field.setdefault("versions", field.get("taggedVersions"))
                return schema

            class TransactionLogValue(ApiData, load_json=name):  # type: ignore[misc, call-arg]
                json_patch: Any = classmethod(patch)
    except (ImportError, OSError) as exc:
        print(f"generic engine unavailable: {exc}", file=sys.stderr)
        return {}
    struct = TransactionLogValue._struct
    compiled = {v: struct.compiled_decode_from(v, compact=v == 1, tagged=v == 1, data_class=TransactionLogValue)
                for v in (0, 1)}  # fmt: skip

    def public(values: Sequence[bytes]) -> None:
        for data in values:
            TransactionLogValue.decode(data)

    def codegen(values: Sequence[bytes]) -> None:
        # The engine's generated per-version decoder, its fastest path (ApiData.decode reads via BytesIO).
        for data in values:
            compiled[data[1]](data, 2)

    return {"engine_decode_per_s": public, "engine_compiled_per_s": codegen}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_codec", description=__doc__)
    parser.add_argument("--records", type=int, default=20_000, help="distinct values per data set")
    parser.add_argument("--repeat", type=int, default=7, help="passes per measurement; the best one counts")
    parser.add_argument("--seed", type=int, default=20_241_119)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: time.perf_counter; cpu: time.process_time, which ignores time spent waiting on a busy host",
    )
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    load_before = os.getloadavg()[0]

    engine = generic_engine()
    rows: list[dict[str, Any]] = []
    for name, make in DATASETS.items():
        rng = random.Random(args.seed)
        values = [encode_value(make(rng)) for _ in range(args.records)]
        assert all(decode_value(v) is not None for v in values)
        row: dict[str, Any] = {
            "dataset": name,
            "avg_bytes": round(sum(map(len, values)) / len(values), 1),
            "decode_value_per_s": round(best_rate(loop_decode, values, args.repeat, clock)),
            "decode_values_per_s": round(best_rate(decode_values, values, args.repeat, clock)),
        }
        for column, run in engine.items():
            row[column] = round(best_rate(run, values, max(1, args.repeat // 2), clock))
        rows.append(row)

    columns = ["decode_value_per_s", "decode_values_per_s", "engine_decode_per_s", "engine_compiled_per_s"]
    header = " ".join(f"{c.removesuffix('_per_s'):>21}" for c in columns)
    print(f"{'records/s (' + args.clock + ')':<24} {'bytes':>6} {header}")
    for row in rows:
        rates = " ".join(f"{row[c]:>21,}" if c in row else f"{'-':>21}" for c in columns)
        print(f"{row['dataset']:<24} {row['avg_bytes']:>6} {rates}")
    print(
        json.dumps(
            {
                "benchmark": "codec",
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "clock": args.clock,
                "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "records": args.records,
                "repeat": args.repeat,
                "results": rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
