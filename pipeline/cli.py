"""``maskray`` command line: run, submit, report, fetch-model.

Exit status: 0 all inputs ok or skipped; 3 the run completed but some inputs failed; 2 bad
usage or config (one line on stderr, before any image is processed), or the output is held by a
live run; 4 the run's record could not be written (disk full, permission, quota, lost bucket: one
line naming the object and the cause); 130 / 143 stopped by SIGINT / SIGTERM (one line; re-run to
resume); 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Any

from maskray.pipeline.config import ConfigError, RunConfig, redact_text, redact_uri, resolve_config
from maskray.pipeline.stopping import Stopped

EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_PARTIAL, EXIT_RECORD = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # SIGINT; SIGTERM during a run exits 143 (maskray.pipeline.stopping.EXIT_SIGNAL)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with any of the options below; flags override it")
    p.add_argument("--input", help="gs://, s3:// or local prefix, or a .txt/.csv/.parquet list of URIs")
    p.add_argument("--output", help="gs://, s3:// or local prefix")
    p.add_argument("--model", help="path or URI of u2netp.onnx (default: the user cache, fetched on first use)")
    p.add_argument("--model-md5", help="expected md5; 'none' skips the check")
    p.add_argument("--format", choices=["mask", "cutout", "both"])
    p.add_argument("--bgcolor", help="R,G,B,A background for cutouts")
    p.add_argument("--post-process-mask", "-ppm", action="store_const", const=True, help="rembg's -ppm")
    p.add_argument("--overwrite", action="store_const", const=True, help="redo inputs that already have masks")
    p.add_argument(
        "--allow-local-sources",
        action="store_const",
        const=True,
        help="let a list read from a bucket name local paths (each worker reads its own disk)",
    )
    p.add_argument(
        "--force",
        action="store_const",
        const=True,
        help="run even if another run holds the output's lease (it must not be running)",
    )
    p.add_argument("--pool-size", type=int, help="inference actors (default: the cluster's CPUs)")
    p.add_argument("--cpus-per-actor", type=float)
    p.add_argument("--intra-op-threads", type=int)
    p.add_argument("--inter-op-threads", type=int)
    p.add_argument("--graph-optimization", choices=["disable", "basic", "extended", "all"])
    p.add_argument("--batch-size", type=int, help="images per inference call (default 4 on CPU, 64 on CUDA)")
    p.add_argument(
        "--engine",
        choices=["auto", "ort", "openvino", "torch"],
        help="auto (default): the fastest installed engine whose masks agree with ort's",
    )
    p.add_argument("--precision", choices=["fp32", "bf16"], help="bf16 needs avx512_bf16/amx_bf16 hardware")
    p.add_argument("--device", choices=["cpu", "cuda"], help="cuda: the inference pool runs on GPUs")
    p.add_argument("--gpus-per-actor", type=float, help="GPU share of each inference actor (default 0.5)")
    p.add_argument("--decode-cpus", type=float)
    p.add_argument("--write-cpus", type=float)
    p.add_argument("--max-pixels", type=int)
    p.add_argument("--png-level", type=int)
    p.add_argument(
        "--mask-resize",
        choices=["cubic", "lanczos"],
        help="mask upscale: cubic (default, fast) or lanczos (rembg's exact masks, with --engine ort)",
    )
    p.add_argument(
        "--fast-decode",
        action="store_const",
        const=True,
        help="decode JPEGs at a reduced scale for the model: much cheaper at 12 MP, masks differ more",
    )
    p.add_argument("--io-threads", type=int, help="concurrent storage requests per worker (default 16)")
    p.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs for a locally started Ray")
    p.add_argument("--endpoint-url", help="storage endpoint (emulators, S3-compatible stores)")
    p.add_argument("--run-id")
    p.add_argument("--no-progress", dest="progress", action="store_const", const=False)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    flags = {k: v for k, v in vars(args).items() if k in RunConfig.model_fields}
    if getattr(args, "endpoint_url", None):
        flags["storage_options"] = {"endpoint_url": args.endpoint_url}
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maskray", description="Background removal for whole image catalogs, on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(sub.add_parser("run", help="mask every image under a prefix or in a list"))
    submit = sub.add_parser("submit", help="run as a Ray job on a cluster (RAY_ADDRESS=http://head:8265)")
    add_run_arguments(submit)
    submit.add_argument("--no-pip", dest="pip", action="store_false", help="the cluster already has the deps")
    submit.add_argument("--no-wait", dest="wait", action="store_false", help="submit and return")
    report = sub.add_parser("report", help="render <output>/_report.html from the latest run")
    report.add_argument("output")
    report.add_argument("--price-per-hour", type=float, help="$/h of the machines (default: published c4d rate)")
    report.add_argument("--endpoint-url")
    fetch = sub.add_parser("fetch-model", help="download and verify u2netp.onnx into the user cache (or --dest)")
    fetch.add_argument("--dest", default=None)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from maskray.pipeline.report import print_summary
    from maskray.pipeline.run import execute

    flags = flags_from_args(args)
    cfg = resolve_config(flags, args.config)
    result = execute(cfg)
    print_summary(result.summary)
    return EXIT_PARTIAL if result.exit_code == 3 else EXIT_OK


SUBMIT_ONLY = {"--address": 1, "--no-pip": 0, "--no-wait": 0}


def run_argv_for_job(argv: list[str]) -> list[str]:
    """The submit command line minus submit's own flags: what the job runs as `maskray run`."""
    out, skip = [], 0
    for token in argv:
        name = token.split("=", 1)[0]
        if skip:
            skip -= 1
        elif name in SUBMIT_ONLY:
            skip = SUBMIT_ONLY[name] if "=" not in token else 0
        else:
            out.append(token)
    return out


SECRET_OPTION = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)


def refuse_shipped_credentials(cfg: RunConfig) -> None:
    """A job's entrypoint, config and runtime_env are stored by the cluster and shown in its
    dashboard: credentials travel as the nodes' service account or environment, never in them."""
    secret = [k for k in cfg.storage_options if SECRET_OPTION.search(k)]
    in_uri = [n for n in ("input", "output", "model") if redact_uri(getattr(cfg, n)) != getattr(cfg, n)]
    if secret or in_uri:
        what = ", ".join([*(f"storage_options.{k}" for k in secret), *(f"credentials in {n}" for n in in_uri)])
        raise ConfigError(
            f"submit: {what} would be stored with the job; give the cluster's nodes a service "
            "account or set the credentials in their environment (see cluster/README.md)"
        )


def cmd_submit(args: argparse.Namespace, argv: list[str]) -> int:
    import os

    from maskray.pipeline.submit import submit
    from maskray.pipeline.weights import default_model

    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError("submit: no cluster address: pass --address http://HEAD:8265 or set RAY_ADDRESS")
    cfg = resolve_config(flags_from_args(args) | {"address": None}, args.config)  # fail fast, locally
    refuse_shipped_credentials(cfg)
    return submit(
        address, run_argv_for_job(argv[1:]), args.config, cfg.model == default_model(), pip=args.pip, wait=args.wait
    )


def cmd_report(args: argparse.Namespace) -> int:
    from maskray.pipeline.report import write_report

    opts = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    try:
        print(write_report(args.output, opts, args.price_per_hour))
    except FileNotFoundError:
        raise ConfigError(f"report: no _summary.json under {args.output} (run maskray there first)") from None
    return EXIT_OK


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from maskray.pipeline.weights import fetch_model

    print(fetch_model(args.dest))
    return EXIT_OK


def redact_record(record: logging.LogRecord) -> bool:
    """Our log lines never carry a credential (they may quote a URI or a client's message)."""
    record.msg, record.args = redact_text(record.getMessage()), None
    return True


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is now (a notebook or a test may swap it after set-up)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging() -> None:
    """Our warnings as ``maskray: WARNING: ...``; storage clients' own retry chatter stays quiet
    (a failure reaches the user once, as our one-line message)."""
    log = logging.getLogger("maskray")
    if not log.handlers:
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("maskray: %(levelname)s: %(message)s"))
        handler.addFilter(redact_record)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    for noisy in ("gcsfs", "s3fs", "aiobotocore", "botocore", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)


def record_error(exc: BaseException | None) -> str | None:
    """The RecordError behind ``exc`` (raised here, or in a write task and wrapped by Ray), if any."""
    from maskray.pipeline.manifest import RecordError

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, RecordError):
            text = str(exc).strip().splitlines()
            return next(
                (line.split("RecordError: ", 1)[-1] for line in reversed(text) if "cannot write" in line),
                text[-1] if text else "cannot write the run's record",
            )
        exc = exc.__cause__ or exc.__context__
    return None


def missing_extra(exc: BaseException) -> bool:
    """A bucket URI without its optional filesystem package (imported here: fsspec stays out of --help)."""
    from maskray.operators.storage import MissingExtraError

    return isinstance(exc, MissingExtraError)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    try:
        if args.command == "submit":
            return cmd_submit(args, argv)
        return {"run": cmd_run, "report": cmd_report, "fetch-model": cmd_fetch_model}[args.command](args)
    except ConfigError as exc:
        print(f"maskray: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    except Stopped as stop:  # its one line was printed when the signal came
        return stop.exit_code
    except Exception as exc:  # noqa: BLE001 - a lost record is one line and exit 4, never a traceback
        if missing_extra(exc):
            print(f"maskray: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        record = record_error(exc)
        if record is None:
            raise
        print(
            f"maskray: {redact_text(record)}; masks written without a row are redone by the next run", file=sys.stderr
        )
        return EXIT_RECORD
    except KeyboardInterrupt:
        print("maskray: interrupted; re-run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
