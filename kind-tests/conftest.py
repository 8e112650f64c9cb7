"""Fixtures every real-cluster suite may ask for: the built binaries (built
with cargo when missing), the Debian tools a suite drives (installed with
apt-get when missing and root, else the suite fails saying so) and the
directory a suite leaves its output in."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def target_dir():
    """Where the built binaries are: $KAI_TARGET, else target/debug."""
    return os.path.abspath(os.environ.get("KAI_TARGET") or os.path.join(ROOT, "target", "debug"))


@pytest.fixture(scope="session")
def built(target_dir):
    """built(packages, files): `files` under target_dir, after `cargo build -p`
    of `packages` when any is missing; the directory."""
    def build(packages, files):
        if not all(os.path.exists(os.path.join(target_dir, f)) for f in files):
            args = [a for p in packages for a in ("-p", p)]
            r = subprocess.run(["cargo", "build", "--locked", "-q", *args], cwd=ROOT, capture_output=True, text=True)
            assert r.returncode == 0, f"cargo build {' '.join(args)}: {r.stderr[-2000:]}"
        missing = [f for f in files if not os.path.exists(os.path.join(target_dir, f))]
        assert not missing, f"not built under {target_dir}: {missing}"
        return target_dir
    return build


@pytest.fixture(scope="session")
def debian_tools():
    """debian_tools({command: package}): each command on PATH, installing
    the packages of the missing ones with apt-get when root."""
    def need(commands):
        missing = sorted({pkg for cmd, pkg in commands.items() if not shutil.which(cmd)})
        if missing:
            if os.geteuid() != 0:
                pytest.fail(f"needs the Debian packages {' '.join(missing)}: apt-get install {' '.join(missing)}")
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), stdout=subprocess.DEVNULL)
        return {cmd: shutil.which(cmd) for cmd in commands}
    return need


@pytest.fixture(scope="module")
def out_dir(request):
    """Where a suite leaves what a person reads after it (logs, reports,
    screenshots): $ENV, else target/NAME, the module saying which as
    `OUT = (ENV, NAME)`."""
    env, name = request.module.OUT
    d = os.path.abspath(os.environ.get(env) or os.path.join(ROOT, "target", name))
    os.makedirs(d, exist_ok=True)
    return d
