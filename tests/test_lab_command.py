"""`make lab` starts JupyterLab on weeks/: start the same server headless on loopback and ask it for week 16."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_command_serves_the_weeks():
    recipe = re.search(r"^lab:.*\n\t(.+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert "jupyter lab" in recipe and "--notebook-dir=weeks" in recipe
    port = _free_port()
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--notebook-dir=weeks", "--no-browser",
           f"--port={port}", "--ip=127.0.0.1", "--IdentityProvider.token=", "--ServerApp.password="]
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # as the Makefile's LAB_ARGS does
    server = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/16", timeout=5) as r:
                    listing = json.load(r)
                break
            except OSError:
                assert server.poll() is None, f"jupyter lab exited: {server.stderr.read()[-2000:]}"
                assert time.monotonic() < deadline, "jupyter lab did not answer within 90 s"
                time.sleep(1)
        names = {item["name"] for item in listing["content"]}
        assert any(n.endswith(".ipynb") for n in names), names
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab", timeout=10) as r:
            assert r.status == 200 and "JupyterLab" in r.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=30)
