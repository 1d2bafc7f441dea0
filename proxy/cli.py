"""``radixgate`` command line: ``serve`` (the proxy), and pass-through subcommands (``demo``, ``report``, ``sim``).

``radixgate serve [--config FILE] [--host H] [--port P] [--admin-port A] [--worker URL]...
[--policy NAME] [--grpc-port G] [--log-level L]`` loads the config (YAML → ``RADIXGATE_*`` env →
these flags; ``--worker`` adds to ``workers.static``), runs on uvloop, prints one
``READY http=… admin=…`` line on stdout once serving, drains on SIGTERM / SIGINT and re-reads its
keys file and certificate on SIGHUP. With ``--check`` it builds everything a start builds (policy,
keys, certificate, tokenizer, tracing) without opening a port, prints the effective config as YAML
(every field, after YAML, environment and flags; secrets live in files and the environment, never
in it) and exits 0, or names the bad field and exits 2.

Pass-through subcommands hand the rest of the command line to ``<module>.main(argv)``; the module
is imported only when its subcommand runs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from proxy.config import Config, ConfigError, load

PASS_THROUGH: dict[str, tuple[str, str]] = {
    "demo": ("proxy.demo", "radixgate in front of simulated workers under a workload; stage breakdown + verdict"),
    "report": ("proxy.diagnose.report", "diagnosis report from a running proxy or saved results"),
    "sim": ("proxy.sim.__main__", "one simulated SGLang worker process (flags as `python -m proxy.sim`)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixgate", description="Prefix-affinity sidecar proxy for SGLang.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file")
    serve.add_argument("--host", help="public bind address (server.host)")
    serve.add_argument("--port", type=int, help="public port (server.port)")
    serve.add_argument("--admin-port", type=int, help="admin port: /metrics, /workers (server.admin_port)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port, 0 = off (server.grpc_port)")
    serve.add_argument("--worker", action="append", default=[], metavar="URL",
                       help="worker URL; repeatable; adds to workers.static")
    serve.add_argument("--peer", action="append", default=[], metavar="URL",
                       help="another replica's admin URL; repeatable; adds to routing.peers")
    serve.add_argument("--policy", help="routing policy (routing.policy)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="telemetry.log_level")
    serve.add_argument("--check", action="store_true",
                       help="validate the config as a start would, print it as YAML, exit (0 ok, 2 bad)")
    for name, (_, help_text) in PASS_THROUGH.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    overrides: dict[str, Any] = {}
    for flag, path in (("host", "server.host"), ("port", "server.port"), ("admin_port", "server.admin_port"),
                       ("grpc_port", "server.grpc_port"), ("policy", "routing.policy"),
                       ("log_level", "telemetry.log_level")):
        value = getattr(args, flag)
        if value is not None:
            overrides[path] = value
    if args.worker:
        base = load(args.config)
        overrides["workers.static"] = [{"url": w.url, "model": w.model} for w in base.workers.static] + list(
            args.worker)
    if args.peer:
        overrides["routing.peers"] = list(load(args.config).routing.peers) + list(args.peer)
    return load(args.config, overrides=overrides)


async def serve(cfg: Config) -> None:
    from proxy.app import App
    from proxy.gctune import settle_after_startup
    from proxy.telemetry.logging import setup_logging

    setup_logging(cfg.telemetry.log_level)
    app = App(cfg)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, app.rotation.reload_all)  # rotated keys and certificate
    await app.start()
    settle_after_startup()  # the start-up heap never becomes garbage: keep the collector off it
    try:
        print(f"READY http={cfg.server.host}:{app.http_port} admin={cfg.server.admin_host}:{app.admin_port}"
              + (f" grpc={app.grpc_port}" if app.grpc_port else ""), flush=True)
        await stop.wait()
    finally:
        await app.stop()


async def check(cfg: Config) -> None:
    """Build the app as ``serve`` would (everything but its ports), then print the effective config."""
    import dataclasses

    import yaml

    from proxy.app import App

    App(cfg)
    print(yaml.safe_dump(_plain(dataclasses.asdict(cfg)), sort_keys=False), end="", flush=True)


def _plain(value: Any) -> Any:
    """Tuples and mappings of ``asdict`` as YAML's lists and dicts."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "items"):  # a Mapping field (routing.params)
        return {k: _plain(v) for k, v in value.items()}
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASS_THROUGH:
        module = importlib.import_module(PASS_THROUGH[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"radixgate: config error: {e}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(check(cfg) if args.check else serve(cfg))
    except ConfigError as e:  # policy params are validated when the app is built
        print(f"radixgate: config error: {e}", file=sys.stderr)
        return 2
    return 0
