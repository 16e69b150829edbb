"""The engine host: one long-lived vLLM AsyncLLM per deployment per process.

Every request in the process goes into that one engine, concurrently, so vLLM's continuous batching
and prefix cache do their work. The host is bound to the event loop that started it: the web
server's loop in the embedded default, a worker's engine thread's loop under Celery. Nothing here
touches the database; it turns token ids and sampling fields into a stream of text deltas.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class EngineState(enum.StrEnum):
    IDLE = "idle"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


class EngineUnavailable(Exception):
    """The engine failed to start or did not become ready in time."""


class EngineRequestError(Exception):
    """The engine refused or failed one request (bad parameters, engine died mid-stream)."""


@dataclass(frozen=True)
class EngineSpec:
    """What an engine needs to start; built from a ModelDeployment, free of the ORM."""

    name: str
    model_path: str
    max_context: int
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    enforce_eager: bool = True
    # How long, on a CPU host, vLLM's scheduler process busy-waits for a step's output before it
    # sleeps until it comes (see `inference/engine/vllm_internals.py`); 1000 is vLLM's own and leaves it.
    cpu_scheduler_spin_ms: int = 1000
    # How long, on a CPU host, vLLM's model processes busy-wait for the next step before they sleep
    # until it comes (see `_shorten_worker_spin`); 1000 is vLLM's own and leaves them alone.
    cpu_worker_spin_ms: int = 1000
    extra_args: dict[str, Any] = field(default_factory=dict)

    @property
    def uses_priority(self) -> bool:
        return self.extra_args.get("scheduling_policy") == "priority"

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "model": self.model_path,
            "served_model_name": self.name,
            "max_model_len": self.max_context,
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
            "enforce_eager": self.enforce_eager,
            "enable_prefix_caching": True,
            # vLLM's own metrics (running/waiting requests, KV-cache use, prefix-cache hits) on
            # /metrics of the process hosting the engine, as `vllm serve` has them; an engine step
            # pays a few counters for it. Nothing calls its periodic log line, so none is written.
            "disable_log_stats": False,
            # Adds the methods the host calls on the model processes (inference/engine/vllm_internals.py).
            "worker_extension_cls": "inference.engine.vllm_internals.WorkerTuning",
        }
        args.update(self.extra_args)
        return args


@dataclass(frozen=True)
class Delta:
    """New text from one engine step, with the running token counts, and the log probabilities of
    its tokens when the request asked for them (`token_logprobs`)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finished: bool
    finish_reason: str | None
    logprobs: list[dict[str, Any]] | None = None
    # Of the prompt's tokens, those the prefix cache held (vLLM's RequestOutput.num_cached_tokens).
    cached_tokens: int = 0


def token_logprobs(token_ids: Any, positions: Any, top: int) -> list[dict[str, Any]]:
    """Each sampled token's log probability and the `top` most likely tokens' at its place, from
    vLLM's per-position maps (token id -> Logprob, the sampled token's among them), as
    `{"token", "logprob", "top": [[token, logprob], ...]}`, most likely first: plain JSON, to travel
    the stream as the text does. Tokens read as vLLM's detokenizer gave them."""
    entries = []
    for token_id, position in zip(token_ids, positions, strict=True):
        sampled = position[token_id]
        ranked = sorted(
            (p for p in position.items() if p[1].rank is not None and p[1].rank <= top), key=lambda p: p[1].rank
        )
        entries.append(
            {
                "token": sampled.decoded_token or "",
                "logprob": sampled.logprob,
                "top": [[logprob.decoded_token or "", logprob.logprob] for _, logprob in ranked[:top]],
            }
        )
    return entries


StateListener = Callable[[str, EngineState], Awaitable[None]]


class EngineHost:
    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.state = EngineState.IDLE
        self.error = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None
        # What the engine computes in, once loaded ("auto" resolved): "bfloat16", "float32", ...
        self.dtype = ""
        self._engine: Any = None
        self._ready = asyncio.Event()
        self._load_task: asyncio.Task | None = None
        self._listeners: list[StateListener] = []

    def add_listener(self, listener: StateListener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        """Begin loading on the running loop; returns at once. Calling it again does nothing."""
        if self._load_task is not None:
            return
        self.loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._load_task = self.loop.create_task(self._load(), name=f"engine-load-{self.spec.name}")

    async def wait_ready(self, timeout: float | None = None) -> None:
        if self.state is EngineState.FAILED:
            raise EngineUnavailable(self.error)
        if self._load_task is None:
            self.start()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            raise EngineUnavailable(f"model {self.spec.name} did not load within {timeout:.0f} s") from None
        if self.state is not EngineState.READY:
            raise EngineUnavailable(self.error or f"model {self.spec.name} is not available")

    async def _load(self) -> None:
        self.started_at = time.monotonic()
        await self._set_state(EngineState.LOADING)
        logger.info("loading model %s from %s", self.spec.name, self.spec.model_path)
        try:
            # Construction takes tens of seconds and blocks; keep it off the event loop. AsyncLLM
            # starts its background tasks lazily on the loop of its first request, which is ours.
            self._engine = await asyncio.to_thread(_build_engine, self.spec)
            await _shorten_worker_spin(self._engine, self.spec.cpu_worker_spin_ms)
        except Exception as exc:
            logger.exception("model %s failed to load", self.spec.name)
            self.error = f"model {self.spec.name} failed to load: {exc}"[:500]
            await self._set_state(EngineState.FAILED)
        else:
            self.ready_after_s = time.monotonic() - self.started_at
            self.dtype = str(self._engine.model_config.dtype).removeprefix("torch.")
            logger.info("model %s ready in %.1f s, in %s", self.spec.name, self.ready_after_s, self.dtype)
            await self._set_state(EngineState.READY)
        finally:
            self._ready.set()

    async def _set_state(self, state: EngineState) -> None:
        self.state = state
        for listener in self._listeners:
            try:
                await listener(self.spec.name, state)
            except Exception:
                logger.exception("engine state listener failed")

    async def stream(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        priority: int = 0,
    ) -> AsyncGenerator[Delta, None]:
        """Stream one request. Cancelling the consuming task aborts the request inside the engine."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        from inference.engine.sampling import sampling_params

        await self.wait_ready()
        try:
            params = sampling_params(sampling)
        except (TypeError, ValueError, VLLMClientError) as exc:  # vLLM's validation raises the last
            raise EngineRequestError(f"invalid sampling parameters: {exc}") from None
        kwargs: dict[str, Any] = {"priority": priority} if self.spec.uses_priority else {}
        top_logprobs = sampling.get("logprobs")
        completion_tokens = 0
        prompt_tokens = len(prompt_token_ids)
        try:
            async for output in self._engine.generate(
                TokensPrompt(prompt_token_ids=prompt_token_ids), params, request_id, **kwargs
            ):
                choice = output.outputs[0]
                completion_tokens += len(choice.token_ids)
                yield Delta(
                    text=choice.text,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens,
                    finished=output.finished,
                    finish_reason=choice.finish_reason,
                    logprobs=None
                    if top_logprobs is None
                    else token_logprobs(choice.token_ids, choice.logprobs, top_logprobs),
                    cached_tokens=getattr(output, "num_cached_tokens", None) or 0,
                )
        except asyncio.CancelledError:
            raise
        except (ValueError, VLLMClientError) as exc:
            raise EngineRequestError(str(exc)) from exc
        except Exception as exc:
            logger.exception("engine request %s failed", request_id)
            raise EngineRequestError(f"the engine failed: {type(exc).__name__}") from exc

    def unfinished_requests(self) -> int:
        """Requests the engine is still working on (an aborted one no longer counts)."""
        from inference.engine.vllm_internals import unfinished_requests

        return unfinished_requests(self._engine) if self._engine is not None else 0

    async def aclose(self) -> None:
        """Shut down, first letting a load in progress finish (its thread cannot be interrupted)."""
        if self._load_task is not None and not self._load_task.done():
            await asyncio.wait([self._load_task])
        self.shutdown()

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        self.state = EngineState.IDLE


def engine_environment_set() -> None:
    """What vLLM reads from the environment, where the operator has not set it: on a CPU host, 1 GiB
    of KV cache (without it, vLLM sizes the cache from a share of the machine's memory)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


# The deployment whose engine's figures vLLM's stat loggers keep in this process. vLLM holds one
# engine's per process: each new logger unregisters every `vllm:` metric before registering its own,
# so a second engine (another deployment started later) would silently replace the first's figures.
# The first engine to start with its loggers on keeps them, across its restarts; later ones start
# with them off, and the process's log says so.
_vllm_figures_of: str | None = None


def vllm_figures_claim(spec: EngineSpec, args: dict[str, Any]) -> dict[str, Any]:
    """`args` with vLLM's stat loggers off unless `spec`'s engine is, or becomes, the one whose figures
    this process shows (`_vllm_figures_of`)."""
    global _vllm_figures_of
    if args.get("disable_log_stats"):
        return args
    if _vllm_figures_of in (None, spec.name):
        _vllm_figures_of = spec.name
        return args
    logger.info(
        "engine %s starts without vLLM's own metrics: this process shows %s's (vLLM keeps one engine's)",
        spec.name,
        _vllm_figures_of,
    )
    return {**args, "disable_log_stats": True}


def _build_engine(spec: EngineSpec) -> Any:
    from chatsite.imports import ML_IMPORTS

    engine_environment_set()
    with ML_IMPORTS:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        from chatsite.cpu import cpu_has_native_bf16
        from inference.engine.vllm_internals import CPU_HOST_SCHEDULER, SPIN_KEY, internals_supported

    args = vllm_figures_claim(spec, spec.engine_args())
    on_cpu = current_platform.is_cpu()
    args["dtype"] = engine_dtype(args["dtype"], on_cpu=on_cpu, native_bf16=on_cpu and cpu_has_native_bf16())
    if on_cpu and spec.cpu_scheduler_spin_ms < 1000 and internals_supported():
        # vLLM's own scheduler, asleep while a step is computed. Only on a CPU host: elsewhere vLLM
        # picks its scheduler itself (an asynchronous one, where it can).
        args["scheduler_cls"] = CPU_HOST_SCHEDULER
        args["additional_config"] = {**args.get("additional_config", {}), SPIN_KEY: spec.cpu_scheduler_spin_ms / 1000}
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))


def engine_dtype(requested: str, *, on_cpu: bool, native_bf16: bool) -> str:
    """The dtype handed to vLLM for a deployment's `requested` one.

    "auto" on a CPU is bfloat16 where the CPU computes in it natively, float32 elsewhere: vLLM's own
    "auto" takes the checkpoint's bfloat16, and on a CPU without native bf16 (AVX2 only) every matrix
    product is then emulated, several times slower than float32 (figures in docs/performance.md). On
    a GPU "auto" stays vLLM's. Anything else is kept.
    """
    if requested != "auto" or not on_cpu:
        return requested
    return "bfloat16" if native_bf16 else "float32"


async def _shorten_worker_spin(engine: Any, spin_ms: int) -> None:
    """On a CPU host, let the model processes sleep soon after a step instead of spinning on.

    A model process (`VLLM::Worker`) busy-waits on its shared-memory queue for one second after
    every step it is given, then sleeps until woken. After each answer, that is a whole core spent
    on nothing for a second, which is exactly when the web process, the worker and PostgreSQL take
    the user's next message. Told to stop after `spin_ms`, it sleeps instead and is woken by the
    scheduler's notification when the next step comes. While it generates, a step comes sooner than
    that and nothing changes; set below a step's length, every step waits for a wake-up and
    generation slows (docs/performance.md). GPU hosts are not touched.
    """
    if spin_ms >= 1000:
        return
    from vllm.platforms import current_platform

    from inference.engine.vllm_internals import internals_supported

    if not current_platform.is_cpu() or not internals_supported():
        return
    try:
        tuned = await engine.collective_rpc("idle_after", args=(spin_ms / 1000,))
    except Exception:
        logger.warning("could not shorten the engine's busy-waiting", exc_info=True)
        return
    if not all(tuned):
        logger.warning("a model process found no queue to shorten the busy-wait of: %s", tuned)


_hosts: dict[str, EngineHost] = {}


def engine_host_for(spec: EngineSpec) -> EngineHost:
    """The process's host for a deployment, created on first use (not started)."""
    host = _hosts.get(spec.name)
    if host is None:
        host = _hosts[spec.name] = EngineHost(spec)
    return host


def engine_hosts() -> dict[str, EngineHost]:
    return dict(_hosts)
