"""Launch stock `python -m sglang.launch_server` on a free loopback port, wait for /health, and
always tear it down. Shared by the main job, the tests, `bench compare` and `tune sweep`.

On CPU it applies the recipe that makes SGLang 0.5.23 run here (SGLANG_USE_CPU_ENGINE=1,
torch_native attention, float32 weights, one OMP core per PP stage); on GPUs it passes only what
it is given.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..machine import CPU_DTYPE
from .client import ServerError, wait_healthy


PORTS = range(12000, 22000)  # below the kernel's ephemeral range and SGLang's own NCCL ports (22000-29999)


def free_port(attempts: int = 64) -> int:
    """A port free now, for a server that binds it only after loading the model. Not from bind(0): that
    hands out ephemeral ports, the range every later bind(0) and outgoing connection draws from, so a port
    picked there can be taken before the server binds it (seen in CI: uvicorn's "address already in use",
    the server then waited 12 min on its own warm-up). SGLang picks its late-bound ports the same way
    (utils/network.py: get_free_port_below_ephemeral)."""
    for port in random.sample(PORTS, attempts):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cores_per_rank(bind: str) -> int:
    """Cores of the first rank in a SGLANG_CPU_OMP_THREADS_BIND value like '0|1' or '0-3|4-7'."""
    n = 0
    for part in bind.split("|")[0].split(","):
        a, _, b = part.partition("-")
        n += (int(b) - int(a) + 1) if b else 1
    return max(1, n)


@dataclass(frozen=True)
class ServerSpec:
    model: str
    pp_size: int = 2
    chunk_size: int | None = 1024
    dynamic: bool = False  # --enable-dynamic-chunking
    device: str = "cpu"
    env: dict = field(default_factory=dict)
    extra_args: tuple = ()
    context_length: int | None = None
    cores: str | None = None  # SGLANG_CPU_OMP_THREADS_BIND override (e.g. '0' for one core)
    dtype: str | None = None  # --dtype; None: CPU_DTYPE on CPU, the model's own elsewhere

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model, "--host", "127.0.0.1",
               "--port", str(port), "--pp-size", str(self.pp_size), "--device", self.device,
               "--watchdog-timeout", "3600"]
        if self.device == "cpu":
            cmd += ["--attention-backend", "torch_native", "--mem-fraction-static", "0.1"]
        dtype = self.dtype or (CPU_DTYPE if self.device == "cpu" else None)
        if dtype:
            cmd += ["--dtype", dtype]
        if self.chunk_size is not None:
            cmd += ["--chunked-prefill-size", str(self.chunk_size)]
        if self.dynamic:
            cmd += ["--enable-dynamic-chunking"]
        if self.context_length:
            cmd += ["--context-length", str(self.context_length)]
        return cmd + list(self.extra_args)

    def environ(self) -> dict:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")
        if self.device == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"
            cores = self.cores or ("|".join(str(i) for i in range(self.pp_size)) if self.pp_size > 1 else
                                   f"0-{max(0, (os.cpu_count() or 1) - 1)}")
            env["SGLANG_CPU_OMP_THREADS_BIND"] = cores
            # SGLang binds OpenMP threads only on AMX/arm64 CPUs (distributed/bootstrap.py
            # _init_cpu_threads_env). Elsewhere every rank would start one thread per core, and PP
            # ranks sharing cores spin against each other (10-30x slower forwards). Size each rank's
            # pool to its own cores instead.
            env.setdefault("OMP_NUM_THREADS", str(_cores_per_rank(cores)))
        if self.context_length:
            env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"
        env.update({k: str(v) for k, v in self.env.items()})
        return env


@dataclass
class RunningServer:
    spec: ServerSpec
    port: int
    proc: subprocess.Popen
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace_s: float = 2.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`: with its schedulers gone, SGLang's
        launcher sleeps 5 s before its crash diagnostics, which a test server's stop need not wait for."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def start(spec: ServerSpec, log_dir: str | None = None) -> RunningServer:
    port = free_port()
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="sglang-cpp-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"server-{port}.log"
    fh = open(log_path, "w")
    proc = subprocess.Popen(spec.command(port), env=spec.environ(), stdout=fh, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return RunningServer(spec, port, proc, log_path)


def _echo(path: Path, needle: str, done: threading.Event, prefix: str) -> None:
    """Print the server log's lines that contain `needle` while it starts (calibration progress); PP0's
    only, since every stage logs the same gathered progress."""
    with open(path, errors="replace") as fh:
        while True:
            line = fh.readline()
            if line:
                if needle in line and not re.search(r" PP[1-9]\d*\]", line[:line.find(needle)]):
                    print(prefix + line.rstrip()[line.find(needle):], flush=True)
            elif done.wait(0.5):
                return


def port_taken(srv: "RunningServer") -> bool:
    """uvicorn's bind error for the server's own port in its log (errno 98): it will never be healthy."""
    return f"('127.0.0.1', {srv.port}): address already in use" in srv.log()


@contextlib.contextmanager
def launched(spec: ServerSpec, timeout: float = 900.0, log_dir: str | None = None, echo: str = ""):
    """A healthy server for the `with` body; torn down on exit, whatever happens. With `echo`, the log
    lines that contain it are printed until the server is healthy."""
    for attempt in range(3):  # a port taken between free_port and the server's bind: again on another
        srv = start(spec, log_dir)
        done = threading.Event()
        if echo:
            threading.Thread(target=_echo, args=(srv.log_path, echo, done, "[server] "), daemon=True).start()
        try:
            wait_healthy(srv.base_url, timeout, srv.proc, failed=lambda: port_taken(srv))
            break
        except ServerError as exc:
            srv.stop()
            if port_taken(srv) and attempt < 2:
                continue
            tail = "\n".join(srv.log().splitlines()[-40:])
            raise ServerError(f"{exc}\n--- last lines of {srv.log_path} ---\n{tail}") from None
        except BaseException:
            srv.stop()
            raise
        finally:
            done.set()
    try:
        yield srv
    finally:
        srv.stop()


_COST_SOURCE = re.compile(r"\[sglang-cpp\] (?:saved calibration to|cost model from calibration cache|"
                          r"cost model from|served cost model \(calibration \+ measured per-chunk overhead\) "
                          r"saved to) (\S+)")


def reported_calibration(log_text: str) -> str | None:
    """The cost-model file a plan server says it used (saved, loaded from cache, or SGLANG_CPP_PROFILE;
    with the measured per-chunk overhead, the served model written after them): the last one its log names. Experiments read this instead of guessing by file time."""
    found = _COST_SOURCE.findall(log_text)
    return found[-1] if found else None


def launch_fails(spec: ServerSpec, timeout: float = 600.0) -> tuple[int | None, str]:
    """Start a server expected to fail; returns (exit code, log), the code None when it was still running at
    the timeout (a hang is no failure: callers assert a code). Raises if it became healthy."""
    srv = start(spec)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and srv.proc.poll() is None:
            with contextlib.suppress(ServerError):
                wait_healthy(srv.base_url, 2.0)
                raise AssertionError("server became healthy although it was expected to fail")
        return srv.proc.poll(), srv.log()
    finally:
        srv.stop()
