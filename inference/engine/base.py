"""What every engine host is, whatever computes its answers: the states it goes through, the deltas it
streams, and the loading and listening they all share. `inference.engine.host` hosts vLLM;
`inference.engine.scripted` hosts the scripted engine; `engine_host_for` picks one by the spec's `engine`.
"""

from __future__ import annotations

import asyncio
import enum
import io
import logging
import time
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
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
    # Which host runs it: "vllm", or "scripted" (inference/engine/scripted.py), which reads only
    # `tokens_per_s` of what follows.
    engine: str = "vllm"
    tokens_per_s: float = 0.0
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
    def host_name(self) -> str:
        """What its host is known by in a process, its heartbeat and its state: the name its answers
        carry (`marked_name`). A deployment switched from one engine to the other is then two hosts,
        never one taken for the other."""
        return marked_name(self.name, self.engine)

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


def marked_name(deployment: str, engine: str) -> str:
    """The model name a deployment's answers carry on `engine`, and its host's name: its own name on
    vLLM, marked `<name>:scripted` on the scripted engine. A slug cannot hold ':', so the mark can
    never name another deployment."""
    return deployment if engine == "vllm" else f"{deployment}:{engine}"


def host_names(deployment: str) -> list[str]:
    """The hosts (`EngineSpec.host_name`) a name may mean, in order: a host's own name exactly, or, for a
    bare deployment name, its vLLM engine, then its scripted one."""
    return [deployment] if ":" in deployment else [deployment, marked_name(deployment, "scripted")]


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


StateListener = Callable[[str, EngineState], Awaitable[None]]


@dataclass(frozen=True)
class PromptImage:
    """An image a prompt shows a vision model: its bytes as the service encoded them, and their type."""

    content_type: str
    data: bytes


# Images reach an engine host already cleaned by the service (decoded in a bounded child within the
# sender's plan, encoded again); this bound only keeps a row edited by hand from becoming a bomb here.
ENGINE_IMAGE_MAX_PIXELS = 100_000_000


def engine_prompt(*, prompt_token_ids: list[int], images: Sequence[bytes] = ()) -> dict[str, Any]:
    """What a request gives the engine, in vLLM's input format (`vllm.inputs.TokensPrompt`): the
    prompt's token ids and, for a vision model, its images as PIL images under
    `multi_modal_data["image"]`, in the order of the image placeholders the chat template wrote.
    vLLM's processor expands each placeholder into the model's image tokens."""
    prompt: dict[str, Any] = {"prompt_token_ids": prompt_token_ids}
    if images:
        prompt["multi_modal_data"] = {"image": [_decoded(data) for data in images]}
    return prompt


def _decoded(data: bytes) -> Any:
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = ENGINE_IMAGE_MAX_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=["PNG", "JPEG", "WEBP"])
            image.load()
    except (Image.DecompressionBombWarning, Image.DecompressionBombError, OSError, ValueError) as exc:
        raise EngineRequestError(f"an image of the request could not be read: {type(exc).__name__}") from None
    return image.convert("RGB")


class EngineHostBase:
    """Loading, readiness and state listeners; a subclass opens its engine (`_open`) and streams."""

    # What `ModelDeployment.engine` names this kind of host by.
    kind = ""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.state = EngineState.IDLE
        self.error = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None
        # What the engine computes in, once loaded ("auto" resolved): "bfloat16", "float32", ...
        self.dtype = ""
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

    async def _open(self) -> None:
        """Build the engine; sets `dtype`. Runs on the host's loop, so anything slow goes to a thread."""
        raise NotImplementedError

    async def _load(self) -> None:
        self.started_at = time.monotonic()
        await self._set_state(EngineState.LOADING)
        logger.info("loading model %s from %s (%s engine)", self.spec.name, self.spec.model_path, self.kind)
        try:
            await self._open()
        except Exception as exc:
            logger.exception("model %s failed to load", self.spec.name)
            self.error = f"model {self.spec.name} failed to load: {exc}"[:500]
            await self._set_state(EngineState.FAILED)
        else:
            self.ready_after_s = time.monotonic() - self.started_at
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

    def stream(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        priority: int = 0,
        images: Sequence[bytes] = (),
    ) -> AsyncGenerator[Delta, None]:
        """Stream one request (`engine_prompt`'s input). Cancelling the consuming task aborts the
        request inside the engine."""
        raise NotImplementedError

    def unfinished_requests(self) -> int:
        """Requests the engine is still working on (an aborted one no longer counts)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Shut down, first letting a load in progress finish (its thread cannot be interrupted)."""
        if self._load_task is not None and not self._load_task.done():
            await asyncio.wait([self._load_task])
        self.shutdown()

    def shutdown(self) -> None:
        self.state = EngineState.IDLE
