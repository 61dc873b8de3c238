"""`LLMHandle`: our handle on one vLLM `LLM`, and what happens when its engine core process dies.

vLLM's engine core cannot recover from an exception in a worker: every later call raises `EngineDeadError` (or,
in process, hangs). Every call into the engine goes through `LLMHandle.call`: a dead engine is shut down and
replaced by a fresh one built with the same arguments, the caller gets a `TwinkleError` saying so (the failed call
is not retried behind its back), and `on_restart` callbacks re-register what lived in the old engine (adapters).
A fresh engine serves the checkpoint's weights: if base weights had been loaded into the old one, the sampler
refuses to serve until they are loaded again (`weights_lost`), rather than silently serving old weights.

"Engine" in this plugin always means vLLM's own: its `LLMEngine` (`LLMHandle.llm_engine`) and the engine core
process behind it. Our wrapper is the handle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Callable, Iterator, TypeVar

from twinkle_core.errors import InvalidInputError, TwinkleError

logger = logging.getLogger(__name__)
_T = TypeVar('_T')


class LLMHandle:
    """`args`: keyword arguments of `vllm.LLM`; `multiprocess`: run the engine core in its own process."""

    def __init__(self, args: dict[str, Any], *, multiprocess: bool) -> None:
        self.args, self.multiprocess = args, multiprocess
        self.llm = self._build()
        self.on_restart: list[Callable[[], None]] = []
        self.base_loaded = False  # base weights were loaded into this engine since it started
        self.weights_lost = False  # a restart dropped loaded base weights; cleared by the next full load
        self.restarts = 0

    @property
    def llm_engine(self) -> Any:
        """vLLM's `LLMEngine` of the current `LLM` (add_lora / remove_lora / configs), as vLLM names it."""
        return self.llm.llm_engine

    def call(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """`fn(llm)`; if the engine turns out dead, restart it and raise TwinkleError naming `what`."""
        exitcode = self._engine_exitcode()
        if exitcode is not None:  # checked first: a request sent to a dead process may wait forever
            cause = f'its process exited with code {exitcode}'
        else:
            try:
                with self._woken_if_the_engine_dies():
                    return fn(self.llm)
            except Exception as exc:
                if not is_engine_dead(exc):
                    raise
                cause = f'{type(exc).__name__}: {exc}'
        self.restart()
        lost = (
            ' Base weights loaded since it started were lost: load them again (a CheckpointEngineManager '
            'resends them with a new manager) before sampling.'
            if self.weights_lost
            else ''
        )
        raise TwinkleError(
            f'The vLLM engine died during {what} ({cause}); it was restarted from the checkpoint '
            f'with its adapters re-registered. Retry the call.{lost}'
        )

    def restart(self) -> None:
        self.shutdown()
        self.llm = self._build()
        self.restarts += 1
        self.weights_lost = self.weights_lost or self.base_loaded
        self.base_loaded = False
        for callback in self.on_restart:
            callback()
        logger.warning('vLLM engine restarted (%d restart(s) so far)', self.restarts)

    def shutdown(self) -> None:
        engine_core = getattr(getattr(self.llm, 'llm_engine', None), 'engine_core', None)
        if engine_core is not None and hasattr(engine_core, 'shutdown'):
            with contextlib.suppress(Exception):  # a dead engine may fail to shut down cleanly
                engine_core.shutdown()

    def engine_core_pid(self) -> int | None:
        """PID of the engine-core process (None when it runs in this process)."""
        process = self._engine_process()
        return process.pid if process is not None else None

    def _engine_process(self) -> Any:
        resources = getattr(self.llm_engine.engine_core, 'resources', None)
        manager = getattr(resources, 'engine_manager', None)
        processes = getattr(manager, 'processes', None) or []
        return processes[0] if processes else None

    @contextlib.contextmanager
    def _woken_if_the_engine_dies(self) -> Iterator[None]:
        """vLLM 0.32's synchronous client waits forever for outputs when its engine process dies mid-call (its
        output thread exits without queueing an error; the async client does queue one). A watchdog polls the
        process while the call runs and, if it died, hands the waiting call an `EngineDeadError`."""
        core = self.llm_engine.engine_core
        outputs = getattr(core, 'outputs_queue', None)
        if outputs is None or self._engine_process() is None:
            yield
            return
        stop = threading.Event()

        def watch() -> None:
            from vllm.v1.engine.exceptions import EngineDeadError

            while not stop.wait(0.5):
                if self._engine_exitcode() is not None:
                    outputs.put_nowait(EngineDeadError())
                    for future in list(getattr(core, 'utility_results', {}).values()):
                        if not future.done():
                            future.set_exception(EngineDeadError())
                    return

        watchdog = threading.Thread(target=watch, name='twinkle-vllm-watchdog', daemon=True)
        watchdog.start()
        try:
            yield
        finally:
            stop.set()
            watchdog.join()

    def _engine_exitcode(self) -> int | None:
        process = self._engine_process()
        return process.exitcode if process is not None else None

    def _build(self) -> Any:
        from vllm import LLM

        with _engine_process(self.multiprocess):
            return LLM(**self.args)


def engine_in_own_process(requested: bool | None) -> bool:
    """Whether vLLM's engine core runs in its own process: as `requested`, else as vLLM's own switch says
    (``VLLM_ENABLE_V1_MULTIPROCESSING``, on unless ``0``); always when this process already has a torch.distributed
    process group (a Ray group's rank, a torchrun rank): an engine in this process would take that group over for its
    own one-rank world and destroy it at shutdown, so ``multiprocess=False`` there is an error."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if requested is False:
            raise InvalidInputError(
                f'vLLMSampler(multiprocess=False): this process already has a torch.distributed process group '
                f'({dist.get_world_size()} rank(s)), which an engine in this process would take over and destroy; '
                'run the engine in its own process (multiprocess=True, the default here).'
            )
        return True
    if requested is not None:
        return requested
    return os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING', '1') != '0'


def is_engine_dead(exc: BaseException) -> bool:
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(exc, EngineDeadError)


@contextlib.contextmanager
def _engine_process(multiprocess: bool) -> Iterator[None]:
    """vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING when the engine is built; set it for this construction only."""
    key = 'VLLM_ENABLE_V1_MULTIPROCESSING'
    previous = os.environ.get(key)
    os.environ[key] = '1' if multiprocess else '0'
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous
