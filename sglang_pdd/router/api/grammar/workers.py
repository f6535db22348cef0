"""The router's grammar-check worker processes: a few of them, each compiling one client grammar at a
time (`router.api.grammar.compile`) under a wall-clock, a CPU and a memory bound; a worker past its
bound is killed and replaced.

Processes, not threads: a compile cannot be stopped from outside while it runs in a thread, and
xgrammar's memory (or a crash in its native code) must not be the router's. They come from
multiprocessing's forkserver with xgrammar preloaded, so a replacement starts without importing
xgrammar (and torch) again; the router's own process, with its threads and event loop, is never
forked. Each worker is driven from one thread of a small pool (`submit` returns a concurrent
future): the event loop never waits on a pipe.
"""

from __future__ import annotations

import logging
import multiprocessing
import pickle
import queue
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from sglang_pdd.router.api.grammar import compile as gc

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # a worker's start: fork, the tokenizer unpickled, xgrammar's view of it built
EXIT_WAIT_S = 5.0


class WorkerUnavailable(RuntimeError):
    """A worker could not start (why: xgrammar cannot read this tokenizer, a start past its timeout)."""


def _context():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["xgrammar", gc.__name__])  # ignored once the forkserver runs
    return ctx


class GrammarWorker:
    """One worker process and the pipe to it; used by one thread at a time."""

    def __init__(self, ctx, tokenizer_blob, vocab_size: int | None, memory_mb: int):
        self._ctx, self._blob, self.vocab_size, self.memory_mb = ctx, tokenizer_blob, vocab_size, memory_mb
        self.process, self.conn = None, None
        self.started = 0  # processes started, replacements included

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    def start(self) -> None:
        if self.alive:
            return
        self.stop()
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(target=gc.serve, args=(child, self._blob(), self.vocab_size, self.memory_mb),
                              name="pdd-router-grammar", daemon=True)
        try:
            p.start()
        except OSError as e:  # the forkserver could not start or fork
            raise WorkerUnavailable(f"a grammar worker did not start: {e}") from None
        finally:
            child.close()
        self.process, self.conn = p, parent
        self.started += 1
        try:
            ready = parent.recv() if parent.poll(START_TIMEOUT_S) else f"not ready within {START_TIMEOUT_S:g} s"
        except (EOFError, OSError):
            ready = "it exited"
        if not isinstance(ready, gc.Ready) or ready.version != gc.VERSION or ready.error:
            self.stop()
            raise WorkerUnavailable(f"a grammar worker did not start: {getattr(ready, 'error', None) or ready}")

    def compile(self, field: str, source: str, timeout_s: float) -> gc.Verdict:
        """`source` compiled within `timeout_s` (wall clock, and as much CPU), or the verdict saying why not."""
        self.start()
        try:
            self.conn.send(gc.Job(field, source, timeout_s))
        except OSError:  # it died since its last job: a fresh one
            self.start()
            self.conn.send(gc.Job(field, source, timeout_s))
        if not self.conn.poll(timeout_s):
            self.stop()
            return gc.Verdict(gc.TIME)
        try:
            verdict = self.conn.recv()
        except (EOFError, OSError):
            return self._died()
        if verdict.status == gc.MEMORY:
            self.stop()  # it exits: an allocation failed part-way
        return verdict

    def _died(self) -> gc.Verdict:
        """The worker ended mid-compile: past its CPU bound (SIGXCPU), or crashed."""
        self.process.join(EXIT_WAIT_S)
        code = self.process.exitcode
        self.stop()
        if code == -signal.SIGXCPU:
            return gc.Verdict(gc.TIME)
        how = f"exit {code}" if code is None or code >= 0 else next(
            (s.name for s in signal.Signals if s == -code), f"signal {-code}")
        return gc.Verdict(gc.CRASHED, how)

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        p, self.process = self.process, None
        if p is not None:
            p.kill()  # a no-op once it exited
            p.join(EXIT_WAIT_S)


class GrammarWorkers:
    """`workers` worker processes, each driven by a thread of its own; `submit` queues a compile."""

    def __init__(self, tokenizer, vocab_size: int | None, workers: int, memory_mb: int):
        self._tokenizer, self._blob_bytes, self._blob_lock = tokenizer, None, threading.Lock()
        ctx = _context()
        self.workers = [GrammarWorker(ctx, self._blob, vocab_size, memory_mb) for _ in range(workers)]
        self._free: queue.SimpleQueue[GrammarWorker] = queue.SimpleQueue()
        for w in self.workers:
            self._free.put(w)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pdd-router-grammar")

    def _blob(self) -> bytes:
        """The tokenizer pickled for the workers, once."""
        with self._blob_lock:
            if self._blob_bytes is None:
                try:
                    self._blob_bytes = pickle.dumps(self._tokenizer)
                except Exception as e:  # a tokenizer with unpicklable state
                    raise WorkerUnavailable(f"the tokenizer cannot be sent to a grammar worker: {e}") from None
            return self._blob_bytes

    def start(self) -> list[Future]:
        """Start every worker now, in the pool's threads (a worker also starts at its first job)."""
        return [self._pool.submit(self._run, GrammarWorker.start) for _ in self.workers]

    def submit(self, field: str, source: str, timeout_s: float) -> Future:
        """A future of the `Verdict` (UNAVAILABLE when no worker could start)."""
        return self._pool.submit(self._run, GrammarWorker.compile, field, source, timeout_s)

    def _run(self, job, *args):
        w = self._free.get()  # never waits: one worker per thread
        try:
            return job(w, *args)
        except WorkerUnavailable as e:
            logger.warning("%s", e)
            return gc.Verdict(gc.UNAVAILABLE, str(e))
        finally:
            self._free.put(w)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for w in self.workers:
            w.stop()
