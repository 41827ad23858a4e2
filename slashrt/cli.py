"""The `slashrt` command: the demo job, the benchmarks and the executor agent.

    slashrt demo                                YSB on a local cluster of 2 executor processes
    slashrt run FILE_OR_MODULE[:NAME]           run your job (checkpoints, resume, stop with a savepoint,
        [--report PATH --report-every S]        ... where it stands, kept in PATH for `slashrt frontiers`)
    slashrt checkpoints DIR [--job NAME]        the checkpoints in a checkpoint directory
    slashrt bench ysb|ro|cm|nexmark [--json]    benchmarks that verify their own results
        [--executors N --mode slash|uppar --zipf S]   ... on N executors (weak scaling)
    slashrt bench redis [--url URL] [--checkpoint-interval S] [--json]   YSB from a Redis stream to a Redis stream
    slashrt bench files [--checkpoint-interval S] [--json]   YSB from Parquet, CSV and .npy files (FileSource)
    slashrt bench peers [--events N] [--json]   slashrt against Polars on the same Parquet files, 1 and 2 threads
    slashrt bench checkpoint [--query ysb|nexmark] [--interval S] [--executors N] [--json]   what checkpoints cost
    slashrt bench chaos [--kills N|0] [--query ysb|nexmark] [--executors N] [--transport shm|tcp] [--events N] [--sink csv|collect] [--interval S] [--seed S] [--redis] [--faults A,B] [--json]   exactly once under SIGKILLs (or other faults)
    slashrt bench report                        the scaling and skew sweeps, with plots
    slashrt bench cc --edges N --epochs E       connected components in a loop, against scipy and NetworkX
        [--executors K --transport shm|tcp]     ... labels partitioned over K executors
    slashrt bench progress [--executors K]      notify latency, loop round trip, progress traffic
    slashrt bench union [--executors K] [--mode slash|uppar|both]   a window behind a union: SSB vs routing records
    slashrt bench operators [--records N] [--baseline]   user operators on ms event times, per batch vs per time
        [--transport shm|tcp --epoch-gap-us G]  ... an epoch every G us instead of full speed
    slashrt frontiers REPORT [--json]           where a run stands (run(..., on_report=REPORT), run --report)
    slashrt executor [--listen HOST:PORT]       an executor agent for multi-host runs
    slashrt spark-demo [--events N] [--json]    Spark generates YSB, ingests into a 2-executor cluster

Every option of every command: `slashrt COMMAND --help`, and docs/guide.md, "The command line"
(tests/test_cli_options.py checks that list against this parser).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import numpy as np

from slashrt._buffer import DEFAULT_SLOT_SIZE
from slashrt._cli_run import Interrupted
from slashrt._logging import ENV_VAR, LEVELS
from slashrt.errors import SlashError

__all__ = ["main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def _alignment_timeout(text: str):
    """auto, none, or a duration >= 0 (seconds, or a string like '50ms')."""
    from slashrt.snapshot.restart import parse_seconds

    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        return parse_seconds(text, "the alignment timeout")
    except SlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _non_negative_int(text: str) -> int:
    value = _positive_int(text) if text.strip() not in ("0",) else 0
    return value


def _zipf_list(text: str) -> list[float]:
    values = [_non_negative_float(z.strip()) for z in text.split(",") if z.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no Zipf exponent")
    return values


def _executor_counts(text: str) -> list[int]:
    values = [_positive_int(k.strip()) for k in text.split(",") if k.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no executor count")
    return values


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default, except where there is none (None, a flag) or the help
    says it itself."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level", choices=LEVELS, help=f"log on standard error from this level up (default: ${ENV_VAR}, else warning)"
    )


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object with the results")
    p.add_argument("--slot-size", type=_positive_int, default=DEFAULT_SLOT_SIZE, help="bytes per buffer slot")
    p.add_argument(
        "--slots", type=_positive_int, help="slots per channel ring (default 96; 64 for `ro --transport`, a 4 MiB ring)"
    )
    p.add_argument("--coalesce", type=_positive_int, default=32, help="most buffers handed to a pipeline at once")
    _add_log_level(p)
    p.add_argument("--repeat", type=_positive_int, default=3, help="report the best of this many runs (each checked)")


def _add_checkpoint_interval(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--checkpoint-interval", type=_positive_float, metavar="S",
        help=f"also run the query {what} with a checkpoint every S seconds, and report its throughput",
    )


def _add_cluster_options(p: argparse.ArgumentParser, *, transport: bool = True) -> None:
    g = p.add_argument_group("multi-executor runs (weak scaling: EVENTS per executor)")
    g.add_argument("--executors", type=_positive_int, help="run on this many executor processes")
    g.add_argument("--mode", choices=["slash", "uppar"], help="shared state backend (default) or repartitioning")
    g.add_argument("--epoch-bytes", type=_positive_int, help="SSB epoch length in bytes of input (default 64 MiB)")
    g.add_argument("--partitions", type=_positive_int, help="SSB partitions per operator (default 256)")
    g.add_argument(
        "--ssb-routing", choices=["auto", "fragments", "direct"],
        help="SSB: fold records into fragments first, or route each to its leader at once (default auto: by "
        "how many keys an epoch touches per record)",
    )
    if transport:
        g.add_argument("--transport", choices=["shm", "tcp", "verbs"], help="between executors (default shm)")
    g.add_argument("--channel-budget", type=_positive_int, metavar="BYTES",
                   help="bytes of rings each executor's channels may hold; its exchanges' rings shrink to fit "
                   "(default 128 MiB)")
    _add_liveness_options(g)


def _add_liveness_options(g) -> None:
    g.add_argument("--heartbeat-interval", type=_non_negative_float, metavar="S",
                   help="seconds between heartbeats on the control connections (default 10)")
    g.add_argument("--heartbeat-timeout", type=_non_negative_float, metavar="S",
                   help="an executor silent this long fails the job (default 50)")


def _liveness(args) -> dict:
    return {k: v for k in ("heartbeat_interval", "heartbeat_timeout") if (v := getattr(args, k, None)) is not None}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slashrt", description="slashrt: stateful stream processing after Slash", formatter_class=_HelpFormatter
    )
    sub = _subcommands(parser, "command")

    demo = sub.add_parser("demo", help="run YSB on a local cluster of 2 executor processes and print its result")
    demo.add_argument("--events", type=_positive_int, default=10_000_000, help="events in all (split over the executors)")
    demo.add_argument("--executors", type=_positive_int, default=2, help="executor processes of the local cluster")
    demo.add_argument("--transport", choices=["shm", "tcp", "verbs"], default="shm", help="between executors")
    _add_log_level(demo)
    _add_liveness_options(demo)

    _add_run(sub)
    bench = sub.add_parser("bench", help="run a benchmark query and check it against a reference")
    queries = _subcommands(bench, "query")

    ysb = queries.add_parser("ysb", help="Yahoo Streaming Benchmark (count views per campaign per 10 s)")
    ysb.add_argument("--events", type=_positive_int, default=10_000_000)
    ysb.add_argument("--campaigns", type=_positive_int, default=1000)
    ysb.add_argument("--zipf", type=_non_negative_float, default=0.0, help="Zipf exponent of ad popularity (0: uniform)")
    ysb.add_argument("--disorder-ms", type=_non_negative_int, default=0, help="out-of-orderness of generated events")
    ysb.add_argument("--input", help=".npy structured array of YSB records (instead of generating)")
    ysb.add_argument("--ads", help=".npy int64 array mapping ad_id to campaign_id")
    ysb.add_argument("--output", help="write window_start_ms,campaign_id,count to this CSV file")
    _add_runtime_options(ysb)
    _add_cluster_options(ysb)

    ro = queries.add_parser("ro", help="read-only: count occurrences per key per window")
    ro.add_argument("--events", type=_positive_int, default=10_000_000)
    ro.add_argument("--keys", type=_positive_int, default=100_000_000, help="keys are uniform over [0, KEYS)")
    ro.add_argument("--window-ms", type=_positive_int, default=1000)
    ro.add_argument(
        "--transport",
        choices=["inproc", "shm", "tcp", "verbs"],
        help="stream the records from a producer process over this transport to a consumer that counts them "
        "(with --executors: the transport between executors)",
    )
    ro.add_argument("--buffer-size", type=_positive_int, default=DEFAULT_SLOT_SIZE, help="with --transport: bytes per buffer")
    ro.add_argument("--floating", type=_non_negative_int, default=0,
                    help="with --transport shm, tcp or verbs: the channel is one of a slot pool with --slots exclusive "
                         "slots and this many floating ones it borrows while it has a backlog (0: a ring)")
    ro.add_argument("--zipf", type=_non_negative_float, default=0.0, help="Zipf exponent of key popularity (0: uniform)")
    _add_runtime_options(ro)
    _add_cluster_options(ro, transport=False)

    cm = queries.add_parser("cm", help="cluster monitoring: mean CPU per job per 2 s")
    cm.add_argument("--events", type=_positive_int, default=10_000_000)
    cm.add_argument("--jobs", type=_positive_int, default=10_000)
    cm.add_argument("--zipf", type=_non_negative_float, default=1.1, help="Zipf exponent of job popularity")
    _add_runtime_options(cm)
    _add_cluster_options(cm)

    nex = queries.add_parser("nexmark", help="NEXMark: query 7, the highest bid per 60 s window")
    nex.add_argument("--query", dest="nexmark_query", type=int, default=7, choices=[7], help="the NEXMark query (7)")
    nex.add_argument("--events", type=_positive_int, default=10_000_000)
    nex.add_argument("--zipf", type=_non_negative_float, default=0.0, help="Zipf exponent of auctions and bidders")
    _add_runtime_options(nex)
    _add_cluster_options(nex)

    rds = queries.add_parser("redis", help="YSB from a Redis stream to a Redis stream (slashrt.connectors)")
    rds.add_argument("--events", type=_positive_int, default=2_000_000)
    rds.add_argument("--campaigns", type=_positive_int, default=1000)
    rds.add_argument("--url", help="a Redis server to use (default: start a throw-away redis-server)")
    _add_checkpoint_interval(rds, "into a transactional sink")
    _add_runtime_options(rds)

    files = queries.add_parser("files", help="YSB from Parquet, CSV and .npy files (slashrt.connectors.FileSource)")
    files.add_argument("--events", type=_positive_int, default=2_000_000)
    files.add_argument("--campaigns", type=_positive_int, default=1000)
    files.add_argument("--parts", type=_positive_int, default=4, help="files per format")
    _add_checkpoint_interval(files, "from the Parquet files")
    _add_runtime_options(files)

    peers = queries.add_parser("peers", help="YSB from the same Parquet files: slashrt against Polars on 1 and 2 threads")
    peers.add_argument("--events", type=_positive_int, default=10_000_000)
    peers.add_argument("--campaigns", type=_positive_int, default=1000)
    peers.add_argument("--parts", type=_positive_int, default=4, help="Parquet files (on 2 executors: 2 each)")
    _add_runtime_options(peers)

    report = queries.add_parser("report", help="weak-scaling and skew sweeps of every query, with PNG plots")
    report.add_argument("--events", type=_positive_int, default=4_000_000, help="records per executor per run")
    report.add_argument("--executors", type=_positive_int, default=2, help="the largest executor count")
    report.add_argument(
        "--zipf", type=_zipf_list, default="0.2,0.6,1.0,1.4,2.0", help="comma-separated Zipf exponents of the skew sweep"
    )
    report.add_argument("--out", default="docs/img", help="directory for the plots and report.json")
    _add_runtime_options(report)

    cc = queries.add_parser("cc", help="connected components in a loop, against scipy and NetworkX")
    cc.add_argument("--edges", type=_positive_int, default=1_000_000, help="random edges (over as many nodes)")
    cc.add_argument("--epochs", type=_positive_int, default=1, help="epochs the edges arrive in (each one checked)")
    cc.add_argument("--graph", choices=["uniform", "powerlaw"], default="uniform", help="how endpoints are drawn")
    cc.add_argument("--executors", type=_positive_int, default=1,
                    help="executors; above 1 runs slashrt.examples.cc_partitioned on them and on one executor")
    cc.add_argument("--transport", choices=["shm", "tcp"], default="shm", help="medium between executors (with --executors K > 1)")
    cc.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the random graph")
    cc.add_argument("--repeat", type=_positive_int, default=3,
                    help="report the best of this many runs of slashrt and scipy (NetworkX runs once)")
    cc.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(cc)

    pln = queries.add_parser("plan", help="the coordinator's plan, descriptors and restart set of an all-to-all job "
                             "of N executors, without processes (and of N/10: how each grows)")
    pln.add_argument("--executors", type=_positive_int, default=10_000, help="executors of the job (at least 10)")
    pln.add_argument("--hosts-every", type=_positive_int, default=32,
                     help="executors per host of the agents' ports the descriptors carry")
    pln.add_argument("--repeat", type=_positive_int, default=3, help="report the best of this many plans")
    pln.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the ports' random numbers")
    pln.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(pln)

    lat = queries.add_parser("latency", help="YSB's window rows' end-to-end latency at a steady input rate (a Paced "
                             "source), on each executor count")
    lat.add_argument("--rate", type=_positive_float, default=1_000_000, help="events per second, all executors together")
    lat.add_argument("--seconds", type=_positive_float, default=10.0, help="seconds of input at that rate")
    lat.add_argument("--executors", type=_executor_counts, default="1,2", help="comma-separated executor counts")
    lat.add_argument("--window-ms", type=_positive_int, default=1000, help="length of the tumbling windows")
    lat.add_argument("--transport", choices=["shm", "tcp"], default="shm", help="medium between executors")
    lat.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(lat)

    prog = queries.add_parser("progress", help="distributed pointstamp progress: notify latency, loop round trip, traffic")
    prog.add_argument("--executors", type=_positive_int, default=2, help="executor processes (at least 2)")
    prog.add_argument("--transport", choices=["shm", "tcp"], default="shm", help="medium between the executors")
    prog.add_argument("--epochs", type=_positive_int, default=200, help="epochs of the notification run")
    prog.add_argument("--epoch-gap-us", type=_non_negative_float, default=0.0,
                      help="microseconds between two epochs of each executor's source in the notification run "
                           "(0: full speed)")
    prog.add_argument("--events", type=_positive_int, default=600_000, help="YSB events of the traffic run (all executors)")
    prog.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(prog)

    uni = queries.add_parser("union", help="a union into a keyed window: the Slash State Backend against routing "
                             "its records by key (bytes shipped, throughput)")
    uni.add_argument("--executors", type=_positive_int, default=2, help="executor processes (at least 2)")
    uni.add_argument("--transport", choices=["shm", "tcp"], default="shm", help="medium between the executors")
    uni.add_argument("--mode", dest="union_mode", choices=["slash", "uppar", "both"], default="both",
                     help="the window on the state backend, routed by key, or both in one run (default)")
    uni.add_argument("--events", type=_positive_int, default=2_000_000,
                     help="YSB events of each of the two streams of each executor")
    uni.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(uni)

    ops = queries.add_parser("operators", help="stateful user operators on millisecond event times: one call per "
                             "batch (per_time='grouped') against one per time")
    ops.add_argument("--records", type=_positive_int, default=200_000, help="clicks (most at their own millisecond)")
    ops.add_argument("--baseline", action="store_true",
                     help="also run with per_time=True (one on_batch call per distinct time: slow)")
    ops.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(ops)

    chk = queries.add_parser("checkpoint", help="throughput without checkpoints, with barrier snapshots and stop-the-world")
    chk.add_argument("--query", dest="checkpoint_query", choices=["ysb", "nexmark"], default="ysb")
    chk.add_argument("--interval", type=_positive_float, default=1.0, help="seconds between checkpoints")
    chk.add_argument("--events", type=_positive_int,
                     help="events of each run (default: enough for about 10 checkpoint intervals at 30 M events/s "
                     "an executor; a run with fewer than 3 periodic checkpoints says so in 'warning')")
    chk.add_argument("--executors", type=_positive_int, default=1, help="executor processes (2 or more: a cluster, no stop-the-world baseline)")
    chk.add_argument("--slow-step-ms", type=_positive_float, metavar="MS",
                     help="instead: YSB with a step after the source sleeping MS per buffer (default rings; with "
                     "--executors N on each executor); report "
                     "whether checkpoints keep their cadence (checkpoints_expected, _completed, cadence_ratio, duration_p99_s)")
    chk.add_argument("--slow-after", choices=["source", "exchange", "graph"], default="source",
                     help="with --slow-step-ms: the slow step right after the source (MS a buffer), or behind the "
                     "exchange (a cluster: MS per 10 ms window of YSB's counts, whose sums per 10 s window are the result), "
                     "or behind an exchange by ad right after the source in YSB (a cluster: MS a buffer)")
    chk.add_argument("--alignment-timeout", type=_alignment_timeout, default="auto", metavar="S|auto|none",
                     help="with --slow-step-ms: take a checkpoint still aligning after S seconds unaligned (auto: half "
                     "the interval, the default; none: always aligned; 0: unaligned at once)")
    _add_runtime_options(chk)

    chaos = queries.add_parser("chaos", help="SIGKILL executors of a checkpointed cluster job; check exactly-once output")
    chaos.add_argument("--kills", type=_non_negative_int, default=10,
                       help="SIGKILLs of random agents at random moments (default 10, about a minute here; 0: only the "
                            "5 at chosen points, which are always made)")
    chaos.add_argument("--query", dest="chaos_query", choices=["ysb", "nexmark"], default="ysb",
                       help="the job: YSB's campaign counts per 10 s window, or NEXMark Q7's highest bid per window")
    chaos.add_argument("--executors", type=int, default=2, help="executor processes (2 or more)")
    chaos.add_argument("--transport", choices=["shm", "tcp"], default="shm",
                       help="the channels between executors: shared memory, or TCP on the loopback")
    chaos.add_argument("--sink", choices=["csv", "collect"], default="csv",
                       help="the job's sink: a transactional CSV directory, or a transactional Collect")
    chaos.add_argument("--seed", type=int, default=0, help="seeds the random kill moments and victims")
    chaos.add_argument("--events", type=_positive_int,
                       help="events of the query's input, split among the executors (default: enough for the kills, "
                            "200,000 per kill, at least 2,000,000)")
    chaos.add_argument("--interval", type=_positive_float, default=0.05,
                       help="seconds between checkpoints (the chosen kill points need several per run)")
    chaos.add_argument("--campaigns", type=_positive_int, default=1000, help="YSB campaigns: the state's size (ysb only)")
    chaos.add_argument("--redis", action="store_true", help="read the events from a Redis stream shared among the executors and write to a transactional "
                       "Redis stream, on a throw-away redis-server")
    chaos.add_argument("--faults", metavar="A,B,...",
                       help="instead of kills, run these fault trials (e.g. corrupt-newest,lose-newest: the newest "
                            "checkpoint damaged after its output was published), each refused or exact; --executors "
                            "1 or more, --events default 100000, --interval default 0.2")
    chaos.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(chaos)

    _add_spark_benchmarks(queries)

    from slashrt.cluster.agent import add_arguments

    add_arguments(sub.add_parser("executor", help="run an executor agent that coordinators deploy jobs on"))

    frontiers = sub.add_parser(
        "frontiers", help="show a run's progress report: every input's frontier and what holds it back"
    )
    frontiers.add_argument(
        "report", help="the JSON file a run keeps with run(..., on_report=PATH) or slashrt run --report PATH"
    )
    frontiers.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_log_level(frontiers)

    spark_demo = sub.add_parser("spark-demo", help="local Spark generates YSB and ingests it into a 2-executor cluster")
    spark_demo.add_argument("--events", type=_positive_int, default=2_000_000)
    spark_demo.add_argument("--campaigns", type=_positive_int, default=1000)
    spark_demo.add_argument("--partitions", type=_positive_int, help="Spark partitions (default: Spark's parallelism)")
    spark_demo.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(spark_demo)
    _show_every_default(parser)
    return parser


def _resume_from(text: str):
    if text == "latest":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'latest' nor a checkpoint number") from None


def _seconds(text: str) -> float:
    from slashrt.snapshot.restart import parse_seconds

    try:
        return parse_seconds(text, "the interval", positive=True)
    except SlashError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _restart(text: str):
    from slashrt.errors import OptionError
    from slashrt.snapshot.restart import parse_restart

    try:
        return parse_restart(text)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_run(sub) -> None:
    run = sub.add_parser(
        "run", help="run your job: FILE_OR_MODULE[:NAME] gives (flow, inputs); checkpoints, resume, stop with a savepoint",
        description="NAME (default job) is a function of no arguments returning (flow, inputs), or that tuple. "
        "With --checkpoint-dir, SIGINT (Ctrl-C) or SIGTERM stops the run with a final savepoint (a second one aborts).",
    )
    run.add_argument("job", metavar="FILE_OR_MODULE[:NAME]", help="a Python file or module, and the name in it")
    run.add_argument("--executors", type=_positive_int, help="run on this many executor processes (a local cluster)")
    run.add_argument("--transport", choices=["shm", "tcp", "verbs"], help="between executors (a local cluster; default shm)")
    run.add_argument("--mode", choices=["slash", "uppar"], help="shared state backend or repartitioning (a local cluster; default slash)")
    run.add_argument("--checkpoint-dir", metavar="DIR", help="take barrier snapshots into DIR (a directory or fsspec URL)")
    run.add_argument("--checkpoint-interval", type=_seconds, metavar="S",
                     help="seconds between checkpoints (or '500ms'); default: only the final one")
    run.add_argument("--tolerable-checkpoint-failures", type=_non_negative_int, metavar="N",
                     help="checkpoints in a row that may fail to be written (a full disk) and are only declined; "
                     "one more fails the job (default 3; a completed checkpoint resets the count)")
    run.add_argument("--alignment-timeout", type=_alignment_timeout, metavar="S|auto|none",
                     help="with --checkpoint-interval: a checkpoint still aligning S seconds (or '50ms') after its "
                     "trigger is taken unaligned, with the records in flight (0: at once; none: always aligned; "
                     "auto, the default: half the interval)")
    run.add_argument("--resume-from", type=_resume_from, metavar="latest|N",
                     help="resume from the newest checkpoint that verifies (none: from the start), or checkpoint N")
    run.add_argument("--restart", type=_restart, metavar="STRATEGY",
                     help="with --executors N and --checkpoint-dir: after an executor dies, restart from the last "
                     "complete checkpoint: 'fixed-delay:attempts=3,delay=1s', 'failure-rate:max-failures=3,"
                     "interval=1min,delay=1s' or 'none' (one executor: rerun with --resume-from latest instead)")
    run.add_argument("--failover", choices=["job", "region"],
                     help="with --restart: restart every executor (job, the default) or only the dead one's region, "
                     "whose progress is then its own (region: executors that exchange nothing restart alone)")
    run.add_argument("--report", metavar="PATH",
                     help="keep where the job stands in this JSON file while it runs and after: every window's or "
                     "operator input's frontier and what holds it back (show it with `slashrt frontiers PATH`)")
    run.add_argument("--report-every", type=_seconds, metavar="S",
                     help="with --report: seconds between reports (or '100ms'; default 0.5)")
    run.add_argument("--slot-size", type=_positive_int, help=f"bytes per buffer slot (default {DEFAULT_SLOT_SIZE})")
    run.add_argument("--slots", type=_positive_int, help="slots per channel ring (default 96)")
    run.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(run)

    chk = sub.add_parser("checkpoints", help="list a checkpoint directory: complete checkpoints, and why others are not")
    chk.add_argument("directory", metavar="DIR", help="a run's --checkpoint-dir (or one job's directory in it)")
    chk.add_argument("--job", help="only this job (the dataflow's name)")
    chk.add_argument("--json", action="store_true", help="print one JSON object")
    _add_log_level(chk)


def _run_user_job(args, given: set[str]) -> int:
    """`slashrt run`: load the job, refuse what its options cannot do, run it, print its summary."""
    from slashrt import _cli_run

    for option in ("checkpoint_interval", "tolerable_checkpoint_failures", "alignment_timeout", "resume_from", "restart"):
        if option in given and args.checkpoint_dir is None:
            raise _Refused(f"{_flag(option)} needs --checkpoint-dir (where the checkpoints are)")
    if "alignment_timeout" in given and args.checkpoint_interval is None:
        raise _Refused("--alignment-timeout applies to periodic checkpoints: give --checkpoint-interval too")
    local = (args.executors or 1) == 1 and args.transport is None and args.mode is None
    if args.failover is not None and (args.restart is None or args.restart.name == "none"):
        raise _Refused("--failover chooses what --restart restarts: give --restart STRATEGY too")
    if args.restart is not None and args.restart.name != "none" and local:
        raise _Refused("--restart needs --executors N: a run on one executor lives in this process, which cannot "
                       "restart itself after it dies; rerun it with --resume-from latest from a supervisor")
    _check_report(args, given)
    flow, inputs = _cli_run.load_job(args.job)
    _check_transport(args.transport)
    options = {k: v for k, v in (("slot_size", args.slot_size), ("slots", args.slots),
                                 ("on_report", args.report), ("report_every", args.report_every)) if v is not None}
    if args.checkpoint_dir is not None:
        checkpoint = args.checkpoint_interval
        tuning = {option: getattr(args, dest) for option, dest in (
            ("tolerable_failures", "tolerable_checkpoint_failures"), ("alignment_timeout", "alignment_timeout")) if dest in given}
        if tuning:
            checkpoint = {"interval": checkpoint, **tuning}
        options.update(checkpoint_dir=args.checkpoint_dir, checkpoint=checkpoint, resume_from=args.resume_from)
        if args.restart is not None and not local:
            options["restart"] = args.restart
            if args.failover is not None:
                options["failover"] = args.failover
    result = _cli_run.run_job(flow, inputs, executors=args.executors or 1, transport=args.transport,
                              mode=args.mode, options=options)
    try:  # (a signal now is ignored: the job is over, its figures are printed whatever comes)
        return _print_run(args, flow, result)
    finally:
        _cli_run.restore_signals()


def _print_run(args, flow, result) -> int:
    """`slashrt run`'s output: its summary as JSON or for a person, and how to go on from a stop."""
    from slashrt import _cli_run

    summary = _cli_run.summary(flow, result, args.executors or 1)
    if args.json:
        print(json.dumps(summary))
        return 0
    if args.resume_from is not None and summary["resumed_from"] is None:
        print(f"slashrt: no complete checkpoint of job {flow.name!r} in {args.checkpoint_dir}: ran from the start",
              file=sys.stderr)
    _print_human({k: v for k, v in summary.items() if k != "outputs"} | {
        f"rows {step}": rows for step, rows in summary["outputs"].items()})
    if summary["stopped"]:
        print(f"\nstopped with savepoint {summary['savepoint']}: the same command with --resume-from "
              f"{summary['savepoint']} (or latest) continues where it stopped")
    return 0


def _check_report(args, given: set[str]) -> None:
    """`--report PATH` needs a directory that exists; `--report-every` needs `--report`."""
    from pathlib import Path

    if "report_every" in given and args.report is None:
        raise _Refused("--report-every needs --report (the file the reports go to)")
    if args.report is not None and not Path(args.report).resolve().parent.is_dir():
        raise _Refused(f"--report {args.report}: directory {Path(args.report).parent} does not exist")


def _checkpoints(args) -> int:
    from slashrt.snapshot.listing import describe, render

    listing = describe(args.directory, args.job)
    print(json.dumps(listing) if args.json else render(listing))
    return 0


def _parsers(parser: argparse.ArgumentParser):
    """`parser` and every subcommand's parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _show_every_default(parser: argparse.ArgumentParser) -> None:
    """Options without a help text still show their default in --help."""
    for p in _parsers(parser):
        for action in p._actions:
            if action.help is None and action.default is not None and action.default is not False:
                action.help = "(default: %(default)s)"


def _subcommands(parser: argparse.ArgumentParser, dest: str):
    """Subcommands whose help shows defaults, like their parent's."""
    sub = parser.add_subparsers(dest=dest, required=True)
    add_parser = sub.add_parser
    sub.add_parser = lambda *a, **kw: add_parser(*a, formatter_class=_HelpFormatter, **kw)
    return sub


def _add_spark_benchmarks(queries) -> None:
    """slashrt.spark's benchmarks (no JVM needed for these)."""
    conv = queries.add_parser("spark-convert", help="Arrow batches from the Spark generator to slashrt records")
    conv.add_argument("--events", type=_positive_int, default=10_000_000)
    conv.add_argument("--batch-rows", type=_positive_int, default=10_000, help="rows per Arrow batch (Spark's default)")
    conv.add_argument("--stream", choices=["ysb", "bids", "cm", "ro"], default="ysb")
    conv.add_argument("--repeat", type=_positive_int, default=3, help="report the best of this many passes")
    conv.add_argument("--json", action="store_true", help="print one JSON object with the results")
    _add_log_level(conv)


def _runtime_options(args) -> dict:
    return {"slot_size": args.slot_size, "slots": args.slots or 96, "coalesce": args.coalesce, "repeat": args.repeat}


class _Refused(Exception):
    """An option given where it has no effect (or cannot work): one line, exit 2."""


def _given(argv: list[str]) -> set[str]:
    """The options the command line gave explicitly (their dests), defaults aside."""
    parser = _parser()
    for p in _parsers(parser):
        for action in p._actions:
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


_CLUSTER_OPTIONS = ("executors", "mode", "epoch_bytes", "partitions", "ssb_routing", "channel_budget")


def _removed(unknown: list[str]) -> str | None:
    """Why an option of earlier slashrt among the `unknown` arguments is gone (None: none is)."""
    from slashrt._run import REMOVED_OPTIONS

    for word in unknown:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and (why := REMOVED_OPTIONS.get(flag[2:].replace("-", "_"))) is not None:
            return f"{flag} was removed: {why}; leave it out"
    return None


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _refuse(given: set[str], dests, why: str) -> None:
    hit = [d for d in dests if d in given]
    if hit:
        raise _Refused(f"{', '.join(map(_flag, hit))} {'does' if len(hit) == 1 else 'do'} not apply {why}")


def _bench_path(args, given: set[str]) -> str:
    """Which benchmark runs ("single", "cluster", "channel" or the query's own), refusing
    options that the chosen path would ignore."""
    if args.query in ("report", "spark-convert", "cc", "plan", "latency", "progress", "checkpoint", "chaos", "operators", "union"):
        return args.query
    cluster = args.query == "nexmark" or any(d in given for d in _CLUSTER_OPTIONS)
    if args.query == "ro":
        if "transport" in given and not cluster:
            _refuse(given, ("window_ms", "zipf", "slot_size", "coalesce"),
                    "to the channel benchmark (`bench ro --transport` without --executors; its buffers are --buffer-size)")
            return "channel"
        _refuse(given, ("buffer_size", "floating"),
                "without --transport, or with --executors (the runtime's buffers are --slot-size; its pools, --channel-budget's)")
    elif "transport" in given:
        cluster = True
    if args.query == "ysb" and args.input is not None:
        _refuse(given, ("events", "zipf"), "with --input (they describe generated events)")
        if args.ads is not None:
            _refuse(given, ("campaigns",), "with --input and --ads (the mapping gives the campaigns)")
    return "cluster" if cluster else "single"


def _ysb_files(args):
    """--input records (None: generate) and the --ads mapping (None: the default one)."""
    from slashrt.bench import ysb

    records = ysb.load_input(args.input) if args.input is not None else None
    mapping = ysb.load_ads(args.ads) if args.ads is not None else None
    if records is not None:
        ysb.check_ads(records, mapping if mapping is not None else ysb.campaign_map(args.campaigns), args.input)
    elif mapping is not None and len(mapping) < args.campaigns * ysb.ADS_PER_CAMPAIGN:
        raise _Refused(f"--ads {args.ads} maps {len(mapping)} ads but --campaigns {args.campaigns} generates ad ids up to "
                       f"{args.campaigns * ysb.ADS_PER_CAMPAIGN - 1}")
    return records, mapping


def _cluster_bench(args) -> dict:
    from slashrt.bench import scaling, ysb

    records = None
    params = {
        "ysb": lambda: {"campaigns": args.campaigns, "disorder_ms": args.disorder_ms},
        "ro": lambda: {"key_range": args.keys, "window_ms": args.window_ms},
        "cm": lambda: {"jobs": args.jobs},
        "nexmark": lambda: {},
    }[args.query]()
    if args.query == "ysb":
        records, params["ads"] = _ysb_files(args)
    result, rows = scaling.bench_with_result(
        args.query,
        events=args.events,
        executors=args.executors or 1,
        mode=args.mode or "slash",
        transport=getattr(args, "transport", None) or "shm",
        zipf=args.zipf,
        epoch_bytes=args.epoch_bytes,
        partitions=args.partitions,
        ssb_routing=args.ssb_routing,
        channel_budget=args.channel_budget,
        params=params,
        records=records,
        **_runtime_options(args),
        **_liveness(args),
    )
    if getattr(args, "output", None) is not None:
        ysb.write_csv(rows, args.output)  # one file, as with one executor: the rows are collected here
        result["output"] = str(args.output)
    return result


def _run_bench(args, given: set[str]) -> dict:
    progress = not args.json or sys.stderr.isatty()
    path = _bench_path(args, given)
    if path == "spark-convert":
        from slashrt.spark.bench import convert_bench

        return convert_bench(rows=args.events, batch_rows=args.batch_rows, repeat=args.repeat, stream=args.stream)
    if path == "cc":
        if args.executors == 1:
            _refuse(given, ("transport",), "with --executors 1 (the example runs in this process)")
        _require(("scipy", "networkx"), "bench", "`slashrt bench cc`")
        from slashrt.bench import cc

        shape = dict(edges=args.edges, epochs=args.epochs, graph=args.graph, seed=args.seed, repeat=args.repeat)
        if args.executors > 1:  # labels partitioned by node id across the executors
            return cc.bench_partitioned(executors=args.executors, transport=args.transport, **shape)
        return cc.bench(**shape)
    if path == "plan":
        if args.executors < 10:
            raise _Refused(f"--executors {args.executors}: `bench plan` compares N executors with N/10; give 10 or more")
        from slashrt.bench import plan

        return plan.bench(args.executors, hosts_every=args.hosts_every, repeat=args.repeat, seed=args.seed)
    if path == "latency":
        if max(args.executors) == 1:
            _refuse(given, ("transport",), "with --executors 1 (one executor has no channels to other executors)")
        from slashrt.bench import latency

        return latency.bench(rate=args.rate, seconds=args.seconds, executors=tuple(args.executors),
                             window_ms=args.window_ms, transport=args.transport)
    if path == "progress":
        if args.executors < 2:
            raise _Refused(f"--executors {args.executors}: `bench progress` measures progress between executors; "
                           "give --executors 2 or more")
        from slashrt.bench import progress as progress_bench

        return progress_bench.bench(executors=args.executors, transport=args.transport, epochs=args.epochs,
                                    events=args.events, epoch_gap_us=args.epoch_gap_us)
    if path == "union":
        if args.executors < 2:
            raise _Refused(f"--executors {args.executors}: `bench union` measures what executors ship each other; "
                           "give --executors 2 or more")
        from slashrt.bench import union

        return union.bench(executors=args.executors, transport=args.transport, mode=args.union_mode, events=args.events)
    if path == "chaos" and args.faults is not None:
        from slashrt.bench import faults

        names = [n.strip() for n in args.faults.split(",") if n.strip()]
        if (why := faults.unknown(names) if names else f"--faults takes a comma-separated list of {', '.join(faults.FAULTS)}") is not None:
            raise _Refused(why)
        if args.executors < 1:
            raise _Refused(f"--executors {args.executors}: give 1 or more")
        args.fault_events = args.events if "events" in given else None
        args.interval = args.interval if "interval" in given else None
        return faults.run_faults(names, args)
    if path == "chaos":
        if args.executors < 2:
            raise _Refused(f"--executors {args.executors}: a run on one executor cannot restart itself after a SIGKILL; "
                           "give --executors 2 or more")
        if args.redis:
            _require(("redis",), "redis", "`slashrt bench chaos --redis`")
            if "sink" in given:
                raise _Refused("--sink: the --redis trial writes to a transactional Redis stream; --sink chooses the "
                               "sink of the other trials")
        if args.chaos_query != "ysb" and "campaigns" in given:
            raise _Refused("--campaigns applies to --query ysb (NEXMark Q7 has no campaigns)")
        from slashrt.bench import chaos

        return chaos.bench(kills=args.kills, query=args.chaos_query, executors=args.executors, transport=args.transport,
                           seed=args.seed, events=args.events, campaigns=args.campaigns, redis=args.redis, sink=args.sink,
                           interval=args.interval)
    if path == "operators":
        from slashrt.bench import operators

        return operators.bench(records=args.records, baseline=args.baseline)
    if path == "checkpoint":
        from slashrt.bench import checkpoint
        from slashrt.errors import OptionError

        if args.slow_step_ms is None and args.slow_after != "source":
            raise OptionError("bench checkpoint --slow-after places the slow step: give --slow-step-ms too")
        cadence = {} if args.slow_step_ms is None else {"slow_step_ms": args.slow_step_ms, "slow_after": args.slow_after,
                                                         "alignment_timeout": args.alignment_timeout}
        return checkpoint.bench(query=args.checkpoint_query, events=args.events, interval=args.interval,
                                executors=args.executors, **cadence, **_runtime_options(args))
    if path == "report":
        _require(("matplotlib",), "bench", "`slashrt bench report`")
        from slashrt.bench import report

        return report.run(events=args.events, max_executors=args.executors, zipfs=args.zipf, out=args.out,
                          **_runtime_options(args))
    if path == "cluster":
        _check_transport(getattr(args, "transport", None))
        return _cluster_bench(args)
    if path == "channel":
        _check_transport(args.transport)
        if args.transport == "inproc":
            _refuse(given, ("floating",), "with --transport inproc (an in-process channel is a ring)")
        from slashrt.bench import channel

        return channel.bench(
            transport=args.transport, buffer_size=args.buffer_size, events=args.events, key_range=args.keys,
            slots=args.slots or channel.DEFAULT_SLOTS, repeat=args.repeat, floating=args.floating,
        )
    if args.query == "ysb":
        from slashrt.bench import ysb

        if args.input is None:
            _ysb_files(args)  # a mapping too short for the generated ad ids, before generating them
        return ysb.bench(
            events=args.events, campaigns=args.campaigns, zipf=args.zipf, input=args.input, output=args.output,
            ads=args.ads, disorder_ms=args.disorder_ms, show_progress=progress, **_runtime_options(args),
        )
    if args.query == "redis":
        _require(("redis",), "redis", "`slashrt bench redis`")
        from slashrt.bench import redis_streams

        return redis_streams.bench(events=args.events, campaigns=args.campaigns, url=args.url,
                                   checkpoint_interval=args.checkpoint_interval, **_runtime_options(args))
    if args.query == "peers":
        _require(("polars",), "bench", "`slashrt bench peers`")
        from slashrt.bench import peers

        return peers.bench(events=args.events, campaigns=args.campaigns, parts=args.parts, **_runtime_options(args))
    if args.query == "files":
        from slashrt.bench import files

        return files.bench(events=args.events, campaigns=args.campaigns, parts=args.parts,
                           checkpoint_interval=args.checkpoint_interval, **_runtime_options(args))
    if args.query == "ro":
        from slashrt.bench import ro

        return ro.bench(events=args.events, key_range=args.keys, window_ms=args.window_ms, zipf=args.zipf,
                        show_progress=progress, **_runtime_options(args))
    from slashrt.bench import cm

    return cm.bench(events=args.events, jobs=args.jobs, zipf=args.zipf, show_progress=progress, **_runtime_options(args))


# optional dependencies -> the extra that installs them (pyproject.toml)
_EXTRAS = {
    "pyspark": "spark", "pandas": "spark", "matplotlib": "bench", "scipy": "bench", "networkx": "bench",
    "redis": "redis", "polars": "bench",
}


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """One line for an optional dependency that is not installed (None: not an optional one)."""
    root = (exc.name or "").split(".")[0]
    if root not in _EXTRAS:
        return None
    return f"{root} is not installed; install it with: pip install 'slashrt[{_EXTRAS[root]}]'"


def _require(modules, extra: str, what: str) -> None:
    """Fail before any work if an optional dependency of `what` is missing."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise _Refused(f"{what} needs {_missing_extra(exc) or exc}") from None


def _check_transport(transport: str | None) -> None:
    """verbs needs pyverbs and a usable RDMA port here: say so once, before starting executors."""
    if transport != "verbs":
        return
    try:
        from slashrt.transport.verbs import discover_device
    except ImportError as exc:
        raise _Refused(f"--transport verbs: {exc}") from None
    try:
        discover_device()
    except SlashError as exc:
        raise _Refused(f"--transport verbs: {exc}") from None


def _executor(args) -> int:
    from slashrt.cluster import agent

    return agent.run_agent(args)


def _flat(result: dict, prefix: str = "") -> dict:
    """A result's fields, a nested one's as `outer.inner` (e.g. `bench plan`'s `growth.plan_s`)."""
    out = {}
    for key, value in result.items():
        if isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _print_human(result: dict) -> None:
    result = _flat(result)
    width = max(len(k) for k in result)
    for key, value in result.items():
        if isinstance(value, float):
            # (3 significant digits below a thousandth: `bench plan`'s seconds, not 0.000)
            value = f"{value:.3g}" if 0 < abs(value) < 0.001 else f"{value:,.3f}" if value < 1000 else f"{value:,.0f}"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        print(f"{key:<{width}}  {value}")


def _demo(args) -> int:
    from slashrt.bench import scaling

    _check_transport(args.transport)
    per_executor = max(1, args.events // args.executors)
    print(
        f"slashrt demo: YSB, {per_executor * args.executors:,} events, 1,000 campaigns, a local cluster of "
        f"{args.executors} executor processes over {args.transport} (shared state backend)"
    )
    result, rows = scaling.bench_with_result(
        "ysb", events=per_executor, executors=args.executors, transport=args.transport, params={"campaigns": 1000},
        **_liveness(args),
    )
    first = rows[rows["window_start_ms"] == rows["window_start_ms"][0]] if len(rows) else rows
    top = first[np.argsort(-first["count"], kind="stable")[:5]]
    print(f"\nwindow starting at {first['window_start_ms'][0] if len(first) else 0} ms, top campaigns by views:")
    for row in top:
        print(f"  campaign {row['campaign_id']:>5}  {row['count']:>6,} views")
    print()
    _print_human(result)
    print()
    verdict = "matches" if result["correct"] else "DOES NOT MATCH"
    print(f"result {verdict} the numpy reference; {result['records_per_s'] / 1e6:.1f} million records/s")
    return 0 if result["correct"] else 1


def _spark_demo(args) -> dict:
    _require(("pyspark", "pandas"), "spark", "`slashrt spark-demo`")
    from slashrt.spark.demo import run_demo

    if not args.json:
        print(f"slashrt spark-demo: local Spark generates {args.events:,} YSB events and ingests them into a "
              "2-executor slashrt cluster over tcp")
    return run_demo(events=args.events, campaigns=args.campaigns, partitions=args.partitions)[0]


def _frontiers(args) -> int:
    from slashrt._frontier_report import describe, read_report

    report = read_report(args.report)
    print(json.dumps(report) if args.json else describe(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # (what parse_args does, but for an option that was removed: one sentence why)
        removed = _removed(unknown)
        if removed is None:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        print(f"slashrt: error: {removed}", file=sys.stderr)
        return 2
    from slashrt._logging import configure_logging

    if args.command == "executor":
        return _executor(args)
    try:
        configure_logging(args.log_level)
        if args.command == "demo":
            return _demo(args)
        if args.command == "frontiers":
            return _frontiers(args)
        if args.command == "run":
            return _run_user_job(args, _given(argv))
        if args.command == "checkpoints":
            return _checkpoints(args)
        if args.command == "spark-demo":
            result = _spark_demo(args)
        else:
            result = _run_bench(args, _given(argv))
    except (SlashError, OSError, _Refused) as exc:
        print(f"slashrt: error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted):  # the run has stopped and removed its executors
        print("slashrt: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        message = _missing_extra(exc)
        if message is None:
            raise
        print(f"slashrt: error: {message}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        _print_human(result)
    return 0 if result.get("correct") else 1


if __name__ == "__main__":
    sys.exit(main())
