"""Where one thread spends its time, by sampling its Python stack from another thread: it sees
the engine thread's frames (cProfile sees only its own thread's) and adds no cost per call.

A sample lands where the thread is when the sampler gets the interpreter's lock, so time spent
in a C call that holds the lock is counted where that call returns: read it as a share, not a
timing.
"""

from __future__ import annotations

import collections
import sys
import threading
from pathlib import Path


def _where(frame) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"


def _function(frame) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}"


class StackSampler:
    """Samples the thread named `thread_name` every `interval_s` inside each `with` block; the
    counts add up over blocks."""

    def __init__(self, thread_name: str, interval_s: float = 0.001):
        self.thread_name = thread_name
        self.interval_s = interval_s
        self.samples = 0
        self.lines: collections.Counter[str] = collections.Counter()
        self.functions: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StackSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="stack-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()

    def _target(self) -> int | None:
        for thread in threading.enumerate():
            if thread.name == self.thread_name:
                return thread.ident
        return None

    def _sample(self) -> None:
        ident = None
        while not self._stop.wait(self.interval_s):
            ident = ident or self._target()
            frame = sys._current_frames().get(ident) if ident else None
            if frame is None:
                continue
            self.samples += 1
            self.lines[_where(frame)] += 1
            seen = set()
            while frame is not None:
                name = _function(frame)
                if name not in seen:
                    seen.add(name)
                    self.functions[name] += 1
                frame = frame.f_back

    def report(self, top: int = 25) -> str:
        """The lines the thread was found on most (self), and the functions it was inside
        (cumulative), each as a share of the samples."""
        n = max(self.samples, 1)
        out = [f"{self.samples} samples of thread {self.thread_name!r}", "self (line):"]
        out += [f"  {c / n:6.1%}  {where}" for where, c in self.lines.most_common(top)]
        out.append("inside (function):")
        out += [f"  {c / n:6.1%}  {name}" for name, c in self.functions.most_common(top)]
        return "\n".join(out)
