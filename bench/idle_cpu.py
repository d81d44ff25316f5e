"""CPU an idle ingress burns a second: started against tansu and the engine double as
bench/overhead.py starts it, then left without requests while its process group's CPU is read
from /proc. What it measures is the background work every replica does forever (the broadcast
logs' fetch loops); ``--against`` runs another checkout's ingress on the same broker too,
sampled over the same seconds.

    .venv/bin/python -m bench.idle_cpu --seconds 20 --against /tmp/base
"""

from __future__ import annotations

import argparse
import signal
import time
import uuid
from pathlib import Path

from bench.harness import group_cpu_seconds, start_double, started_processes
from bench.overhead import profile
from cli.dev.broker import start_tansu
from cli.dev.stack import start_ingress
from titoflow.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds not sampled")
    parser.add_argument("--against", type=Path, help="another checkout whose ingress runs too")
    parser.add_argument(
        "--profile", type=Path, help="py-spy this ingress while idle, into this file"
    )
    args = parser.parse_args()
    settings = Settings()
    with started_processes("titoflow-idle-") as (log_dir, started):
        broker, bootstrap = start_tansu(log_dir)
        started.append(broker)
        double, engine_url = start_double(log_dir, settings.model_path)
        started.append(double)
        run = settings.model_copy(
            update={
                "bootstrap_servers": bootstrap,
                "engine_url": engine_url,
                "topic_prefix": f"idle-{uuid.uuid4().hex[:8]}",
            }
        )
        ingresses = {"this": start_ingress(run, log_dir)[0]}
        started.append(ingresses["this"])
        if args.against:
            other = start_ingress(run, log_dir, "ingress-against", code=args.against)[0]
            ingresses["against"] = other
            started.append(other)
        time.sleep(args.settle)
        before = {name: group_cpu_seconds(p.pid) for name, p in ingresses.items()}
        broker_before = group_cpu_seconds(broker.pid)
        spy = profile(ingresses["this"], args.profile) if args.profile else None
        time.sleep(args.seconds)
        if spy:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        for name, proc in ingresses.items():
            spent = group_cpu_seconds(proc.pid) - before[name]
            print(f"{name}: {1000 * spent / args.seconds:.1f} ms of CPU a second, idle")
        broker_spent = group_cpu_seconds(broker.pid) - broker_before
        print(f"tansu: {1000 * broker_spent / args.seconds:.1f} ms of CPU a second")


if __name__ == "__main__":
    main()
