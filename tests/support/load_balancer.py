"""The load balancer's nginx config as deploy/lb-entrypoint.sh renders it (what the compose
``lb`` service runs), and the real nginx's command line on it, for the tests that check the
config (tests/project/test_compose.py) and run it (tests/e2e/test_topology.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from titoflow.settings import PROJECT_ROOT

NGINX_TEMPLATE = PROJECT_ROOT / "deploy" / "nginx.conf.template"
LB_ENTRYPOINT = PROJECT_ROOT / "deploy" / "lb-entrypoint.sh"
NGINX_INSTALL_HINT = (
    "nginx is not installed. The load-balancer tests run Debian's nginx; scripts/setup.sh "
    "installs it with: command -v nginx >/dev/null || "
    "{ apt-get update -qq && apt-get install -y -qq nginx-light; }"
)


def nginx_binary() -> str:
    path = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if Path(p).is_file()), None
    )
    if path is None:
        pytest.fail(NGINX_INSTALL_HINT)
    return path


def render_lb_config(conf_dir: Path, env: dict[str, str]) -> Path:
    """deploy/lb-entrypoint.sh's own rendering (what the compose `lb` service runs)."""
    result = subprocess.run(
        ["sh", str(LB_ENTRYPOINT), "render"],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LB_TEMPLATE": str(NGINX_TEMPLATE),
            "LB_CONF_DIR": str(conf_dir),
            "LB_TEMP_DIR": str(conf_dir / "temp"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip())


def nginx_argv(conf: Path, *extra: str) -> list[str]:
    """nginx on a rendered config, with its pid and error log beside it, in the foreground.

    ``user`` is the current user: a root master would otherwise run its workers as ``nobody``,
    who cannot enter the test's private temporary directories.
    """
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout
    return [
        nginx_binary(),
        "-p",
        str(conf.parent),
        "-c",
        str(conf),
        "-e",
        "stderr",
        "-g",
        f"daemon off; pid {conf.parent / 'nginx.pid'}; user {user.strip()};",
        *extra,
    ]
