"""`cinq serve [MODEL] --host 127.0.0.1 --port 8000`: the OpenAI-compatible HTTP server (FastAPI + uvicorn)
with streaming, Prometheus metrics at /metrics and a chat playground at /."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


DEFAULT_REQUEST_TIMEOUT = 30.0  # cinq.server.connections' defaults, without importing uvicorn for --help
DEFAULT_LIMIT_CONCURRENCY = 512
DEFAULT_LOG_STATS_INTERVAL = 5.0  # cinq.server.stats_logger.DEFAULT_INTERVAL_S


def add_parser(sub: argparse._SubParsersAction) -> None:
    from cinq.commands.engine_args import add_engine_args
    p = sub.add_parser("serve", help="OpenAI-compatible server with a web playground",
                       description="Serve a model over the OpenAI API (/v1/completions, /v1/chat/completions, "
                                   "/v1/models), with /metrics for Prometheus and a chat playground at /.")
    add_engine_args(p)
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="port (default %(default)s; 0 picks a free one)")
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but /health and the playground page "
                        "(default: $CINQ_API_KEY, else no auth)")
    s.add_argument("--metrics-require-api-key", action="store_true",
                   help="with --api-key, guard /metrics too (default: open, as vLLM leaves it for scrapers)")
    s.add_argument("--served-model-name", nargs="+", default=None,
                   help="model name(s) clients send in 'model' (default: the model path; the embedded "
                        "model's folder name, e.g. cinq-tiny, when no path is given)")
    s.add_argument("--engine-core", default="process", choices=("process", "inproc"),
                   help="where the engine core (scheduler, model, step loop) runs: its own process behind ZMQ, "
                        "so the step loop does not share the GIL with HTTP and streaming (default), or a thread "
                        "of the server's process (inproc)")
    s.add_argument("--max-waiting-requests", type=int, default=1024,
                   help="waiting sequences beyond which requests get 503 + Retry-After (default %(default)s)")
    s.add_argument("--request-body-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT, metavar="SECONDS",
                   help="seconds a client has to send a request whole, headers and body, from its first byte; "
                        "then 408 and the connection is closed (default %(default)s)")
    s.add_argument("--limit-concurrency", type=int, default=DEFAULT_LIMIT_CONCURRENCY, metavar="N",
                   help="open connections + requests in flight beyond which uvicorn answers 503 "
                        "(default %(default)s; 0: no cap)")
    s.add_argument("--uvicorn-log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    s.add_argument("--log-stats-interval", type=float, default=DEFAULT_LOG_STATS_INTERVAL, metavar="SECONDS",
                   help="log throughput, running/waiting requests and KV cache usage this often while there is "
                        "load, as vLLM does (default %(default)s; 0: off)")
    s.add_argument("--disable-log-stats", action="store_true", help="no periodic stats log (vLLM's flag)")
    d = p.add_argument_group("data parallel (Ray; pip install 'cinq[ray]')")
    d.add_argument("--data-parallel-size", "-dp", type=int, default=1, metavar="N",
                   help="engine replicas (Ray actors, each a whole engine with these engine flags) behind this "
                        "server, with prefix-aware routing (default %(default)s: one engine in this process)")
    d.add_argument("--ray-address", default=None,
                   help="Ray cluster to place the replicas on, e.g. 'head:6379' (default: $RAY_ADDRESS, else a "
                        "local cluster started for this server). Every node that hosts a replica needs cinq's "
                        "dependencies and the model folder at the same path; a cluster with token auth needs "
                        "RAY_AUTH_MODE=token in this process's environment, as any Ray client does")
    d.add_argument("--data-parallel-routing", default="prefix", choices=("prefix", "least_loaded", "random"),
                   help="replica choice: the replica that last served the prompt's first KV blocks unless it is "
                        "busier than the least-loaded one (prefix), the least-loaded, or random "
                        "(default %(default)s)")
    p.set_defaults(run=run)


def stats_interval(args: argparse.Namespace) -> float:
    """Seconds between stats log lines; 0: off (``--disable-log-stats`` or ``--log-stats-interval 0``)."""
    from cinq.errors import InvalidParameterError
    if not args.log_stats_interval >= 0:  # also refuses nan
        raise InvalidParameterError(f"--log-stats-interval must be >= 0 seconds, got {args.log_stats_interval}",
                                    "log_stats_interval")
    return 0.0 if args.disable_log_stats else args.log_stats_interval


def _sigterm_as_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    import signal
    import socket

    import uvicorn

    from cinq.commands.engine_args import engine_config_from_args
    from cinq.config import ParallelConfig
    from cinq.engine.protocol import make_engine_client
    from cinq.errors import InvalidParameterError
    from cinq.server.app import build_app
    from cinq.server.connections import ConnectionLimits, uvicorn_config

    ParallelConfig(data_parallel_size=args.data_parallel_size)  # a bad size: one line, before anything starts
    on_ray = args.data_parallel_size > 1 or args.ray_address is not None
    if not 0 <= args.port <= 65535:
        raise InvalidParameterError(f"--port must be in [0, 65535], got {args.port}", "port")
    limits = ConnectionLimits(args.request_body_timeout, args.limit_concurrency or None)
    limits.validate()  # before the model loads
    # a bad model argument or device: one line, before the port is taken; replicas on a Ray cluster run on
    # its machines, so only the device's spelling is checked here
    config = engine_config_from_args(args, local_device=args.ray_address is None)
    log_stats_interval = stats_interval(args)
    # Bind first: a taken port fails in a second, not after loading the model; --port 0 reports the real port.
    family, kind, proto, _, addr = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        raise InvalidParameterError(f"--host/--port: cannot bind {args.host}:{args.port}: {e.strerror}",
                                    "port") from None
    sock.listen(2048)
    host, port = sock.getsockname()[:2]
    dp = args.data_parallel_size
    if on_ray:
        from cinq.dp.dp_engine import DPAsyncLLM
        from cinq.dp.router import RouterConfig
        print(f"cinq serve: starting {dp} replica(s) on Ray ({args.ray_address or 'local cluster'}), "
              f"{args.data_parallel_routing} routing", flush=True)
        llm = DPAsyncLLM(config, dp, args.max_waiting_requests, args.ray_address,
                         RouterConfig(args.data_parallel_routing, config.block_size))
    else:
        llm = make_engine_client(config, args.max_waiting_requests, args.engine_core)
    # No model given: the embedded one, served under its own name (e.g. "cinq-tiny"), as vLLM serves a path.
    names = args.served_model_name or [args.model or Path(config.model).name]
    api_key = args.api_key if args.api_key is not None else os.environ.get("CINQ_API_KEY") or None
    app = build_app(llm, names, config.model, api_key, args.metrics_require_api_key, log_stats_interval)
    if on_ray:
        from cinq.dp.metrics import DPCollector
        app.state.ctx.metrics.registry.register(DPCollector(llm, names[0]))  # router decisions, replica loads
    url_host = f"[{host}]" if ":" in host else host
    core = ""
    if not on_ray:
        pid = getattr(llm, "core_pid", None)
        core = f", engine core in process {pid}" if pid else ", engine core in this process"
    print(f"cinq serve: model {config.model} ({llm.architecture}, {config.dtype}, "
          f"{config.device}{core}) served as {names[0]!r}; max_model_len {llm.max_model_len}", flush=True)
    print(f"cinq serve: KV cache {llm.num_blocks} blocks x {config.block_size} tokens "
          f"= {llm.num_blocks * config.block_size} tokens{' per replica' if dp > 1 else ''}; "
          f"max {config.max_num_seqs} running, "
          f"{args.max_waiting_requests} waiting; auth {'on' if api_key else 'off'}; request timeout "
          f"{limits.request_timeout:g} s, concurrency cap {limits.limit_concurrency or 'none'}", flush=True)
    print(f"cinq serve: listening on http://{url_host}:{port}  (OpenAI API at /v1, playground at /, "
          f"metrics at /metrics)", flush=True)
    server = uvicorn.Server(uvicorn_config(app, limits, args.uvicorn_log_level))
    # uvicorn shuts down gracefully on SIGINT and SIGTERM (the app's lifespan stops the engine core), then raises
    # the signal again with the handlers it found: SIGTERM then ends as Ctrl-C does, as a clean exit.
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown: that is a clean exit
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("cinq serve: stopped", flush=True)
    return 0
