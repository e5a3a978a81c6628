"""chfs-localpool in the background, for the tests (conftest.py) and the
benchmark (python/bench.py): started from its program's path, the pool's
CHFS_SERVER and CHFS_SECRET_FILE read from what it prints, stopped by its
recorded PID."""

import os
import signal
import subprocess


class LocalPool:
    def __init__(self, program: str, servers: int = 2, extra=()):
        self.proc = subprocess.Popen(
            [program, "-n", str(servers), *extra],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.env = {}
        for line in self.proc.stdout:
            for part in line.split(";"):
                k, _, v = part.strip().partition("=")
                if k in ("CHFS_SERVER", "CHFS_SECRET_FILE"):
                    self.env[k] = v
            if "CHFS_SECRET_FILE" in self.env:
                break
        if "CHFS_SERVER" not in self.env:
            self.stop()
            raise RuntimeError("chfs-localpool did not start")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)
