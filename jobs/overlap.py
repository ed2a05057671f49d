"""How one worker overlaps its units (docs/pipeline.md, "Overlap in the worker").

The driver keeps up to IN_FLIGHT calls on each actor and the actor runs them in threads (Ray's
max_concurrency), so while unit n is compressed and written, unit n+1 runs in the model and
unit n+2 is read. Reading (`Turns`) and the model (`ModelThread`) each go in the order the
driver sent the calls: a record's units meet the model in order, after the state the unit
before left, and an input is read forwards (plain gzip cannot seek back). Writes run side by
side, each call returning only once its own unit is durable.

The model runs on one thread of its own (`ModelThread`) that takes the next call's unit as soon
as it finishes one, without waking another thread first: a handoff between threads waits for the
GIL, which a thread running Python (a write, a read) gives up only every switch interval (5 ms),
and that wait, once per unit, left the model idle a tenth of the time on small models.

On CUDA, `HostCopies` takes a unit's outputs off the device without blocking the model: they
are copied into pinned host buffers on a stream of their own once the model's work on them is
done, while the next unit runs. Elsewhere the model's outputs are host arrays already.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager


class Turns:
    """One caller at a time, in the order of the numbers the driver gave its calls (0, 1, 2,
    ...). A call numbered None goes whenever no other holds the turn (a caller that runs its
    units one after another itself)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next = 0
        self._busy = False

    @contextmanager
    def turn(self, seq: int | None):
        with self._cond:
            self._cond.wait_for(lambda: not self._busy and (seq is None or seq == self._next))
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                if seq is not None:
                    self._next = seq + 1
                self._cond.notify_all()


class ModelThread:
    """Runs the calls' model steps on one thread, in the order of the calls' numbers, back to back:
    `submit(seq, fn, arg)` returns a Future of (fn(arg), start, end) (perf_counter seconds on the
    model thread). Calls numbered None run in the order they came, whenever no numbered call is
    due. The model always runs on this one thread: on the CPU a forward's low bits were seen to
    depend on the thread it ran on, and a resumed job must be bit-identical."""

    def __init__(self):
        self._cond = threading.Condition()
        self._due: dict[int, tuple] = {}  # seq -> (fn, arg, future)
        self._any: deque = deque()  # unnumbered calls
        self._next = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="linpipe-model", daemon=True)
        self._thread.start()

    def submit(self, seq: int | None, fn, arg) -> Future:
        fut = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the worker is closed")
            if seq is None:
                self._any.append((fn, arg, fut))
            else:
                self._due[seq] = (fn, arg, fut)
            self._cond.notify()
        return fut

    def skip(self, seq: int | None) -> None:
        """Let the calls after `seq` go without running anything in its turn (it failed before)."""
        if seq is not None:
            self.submit(seq, None, None)

    def _take(self):
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._next in self._due or self._any)
            if self._next in self._due:
                job = self._due.pop(self._next)
                self._next += 1
                return job
            if self._any:
                return self._any.popleft()
            return None

    def _loop(self) -> None:
        while self._run_next():
            pass

    def _run_next(self) -> bool:
        """Runs the next call; False once closed. Its call's references go with this frame, so a
        waiting thread keeps nothing of the last call (a dropped worker is freed)."""
        job = self._take()
        if job is None:
            return False
        fn, arg, fut = job
        if fn is None:
            fut.set_result(None)
            return True
        t0 = time.perf_counter()
        try:
            got = fn(arg)
        except BaseException as e:  # the caller raises it
            fut.set_exception(e)
        else:
            fut.set_result((got, t0, time.perf_counter()))
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()


class Outputs:
    """One unit's outputs on their way to the host: `arrays()` waits until they are there;
    `release()` gives their buffers back once the unit is written."""

    def __init__(self, arrays: dict, state, copied=None, buffers=(), pool=None, dtypes: dict | None = None):
        self._arrays, self._state, self._copied = arrays, state, copied
        self._buffers, self._pool = list(buffers), pool
        self._dtypes = dtypes  # casts still to do on the host (by the caller of arrays(), not the model)

    def arrays(self) -> dict:
        if self._copied is not None:
            self._copied.synchronize()  # the copy alone: the model may be running the next unit
            self._copied = None
        if self._dtypes:
            self._arrays, self._dtypes = cast(self._arrays, self._dtypes), None
        return self._arrays

    def state_arrays(self) -> dict:
        """The boundary state after the unit, as ModelState.to_arrays() gives it."""
        self.arrays()
        return self._state.to_arrays()

    @property
    def buffers(self) -> tuple:
        """The host buffers this unit's outputs are views of, until release()."""
        return tuple(self._buffers)

    def release(self) -> None:
        if self._pool is not None:
            self._pool.give(self._buffers)
        self._buffers = []


def cast(arrays: dict, dtypes: dict) -> dict:
    """The host arrays, those named in `dtypes` cast to that dtype (a store's float16 `hidden`).
    Through torch: its vectorised float32 -> float16 cast is 2.3x numpy's on this project's CPU
    machine, with the same bits (both round to nearest, ties to even; compared over every float32
    of the float16 range)."""
    import numpy as np
    import torch

    out = {}
    for name, a in arrays.items():
        want = dtypes.get(name)
        if want is None or a.dtype == np.dtype(want):
            out[name] = a
        else:
            out[name] = torch.from_numpy(np.ascontiguousarray(a)).to(getattr(torch, str(want))).numpy()
    return out


class HostCopies:
    """Runs units whose outputs leave the device without blocking (CUDA, models other than
    series_norm: their outputs come per lane, and go through Model.forward), reusing pinned host
    buffers: at most one set per unit in flight, each as large as the largest unit seen."""

    def __init__(self, model):
        self.model = model
        self.device = model.device
        self.enabled = self.device.type == "cuda" and not model.config.series_norm
        self._free: dict[tuple, list] = {}
        self._lock = threading.Lock()
        self._stream = None

    KEEP = 4  # free buffers kept per kind: one per unit in flight (IN_FLIGHT), and one spare

    def forward(self, x, state, outputs, dtypes: dict | None = None) -> tuple[Outputs, object]:
        """Model.forward's outputs (float32; a dtype from `dtypes` where given: the store's, cast
        on the device) and the state after x, as Outputs."""
        if not self.enabled:  # host arrays already: cast by whoever writes them
            out, state = self.model.forward(x, state, outputs=outputs)
            return Outputs(out, state, dtypes=dtypes), state
        import torch

        m = self.model
        res, state = m.run(m.to_tensor(x), state.to(self.device), m.select_outputs(outputs), None)
        ran = torch.cuda.Event()
        ran.record()
        side = self._side_stream()
        side.wait_event(ran)  # the copies start once the model's work on this unit is done
        buffers, arrays = [], {}
        with torch.cuda.stream(side):
            for name, t in res.items():
                arrays[name] = self._copy(t[0], (dtypes or {}).get(name, "float32"), side, buffers)
            host_state = state.map(lambda t: self._copy(t, None, side, buffers, keep=True))
            copied = torch.cuda.Event()
            copied.record(side)
        return Outputs(arrays, host_state, copied, buffers, self), state

    def _side_stream(self):
        import torch

        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        return self._stream

    def _copy(self, t, dtype, stream, buffers: list, keep: bool = False):
        """t copied into a pinned buffer on `stream` (cast to dtype there first): its numpy
        view, or with keep, the host tensor."""
        import torch

        t.record_stream(stream)  # t's memory is not reused before the copy has read it
        if dtype is not None:
            t = t.to(getattr(torch, str(dtype)))
        buf = self.take(tuple(t.shape), t.dtype)
        buffers.append(buf)
        view = buf[:t.shape[0]]
        view.copy_(t, non_blocking=True)
        return view if keep else view.numpy()

    def take(self, shape: tuple, dtype):
        """A host buffer of at least shape[0] rows of shape[1:] (pinned on CUDA): a free one, or
        a new one; views of its first rows hold a shorter unit."""
        import torch

        with self._lock:
            free = self._free.get((shape[1:], dtype), [])
            for i, b in enumerate(free):
                if b.shape[0] >= shape[0]:
                    return free.pop(i)
        return torch.empty(shape, dtype=dtype, pin_memory=self.device.type == "cuda")

    def pooled(self) -> list:
        """The free buffers, of every kind: what the next units take before making new ones."""
        with self._lock:
            return [b for free in self._free.values() for b in free]

    def give(self, buffers) -> None:
        """Buffers back for reuse, at most KEEP of a kind (the largest)."""
        with self._lock:
            for b in buffers:
                free = self._free.setdefault((tuple(b.shape[1:]), b.dtype), [])
                free.append(b)
                free.sort(key=lambda f: -f.shape[0])
                del free[self.KEEP:]
