"""The engine host: one long-lived vLLM AsyncLLM per deployment per process (or the scripted engine).

Every request in the process goes into that one engine, concurrently, so vLLM's continuous batching
and prefix cache do their work. The host is bound to the event loop that started it: the web
server's loop in the embedded default, a worker's engine thread's loop under Celery. Nothing here
touches the database; it turns token ids and sampling fields into a stream of text deltas.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from chatsite.cpu import cpu_has_native_bf16
from chatsite.imports import ML_IMPORTS
from inference.engine.base import (
    Delta,
    EngineHostBase,
    EngineRequestError,
    EngineSpec,
    EngineState,
    EngineUnavailable,
    StateListener,
    engine_prompt,
)
from inference.engine.sampling import sampling_params
from inference.engine.scripted import ScriptedEngineHost

__all__ = [
    "Delta",
    "EngineHost",
    "EngineHostBase",
    "EngineRequestError",
    "EngineSpec",
    "EngineState",
    "EngineUnavailable",
    "ScriptedEngineHost",
    "StateListener",
    "engine_host_for",
    "engine_hosts",
]

logger = logging.getLogger(__name__)


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


class EngineHost(EngineHostBase):
    """vLLM's AsyncLLM, built in a thread (tens of seconds) on first start."""

    kind = "vllm"

    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        self._engine: Any = None

    async def _open(self) -> None:
        # Construction takes tens of seconds and blocks; keep it off the event loop. AsyncLLM
        # starts its background tasks lazily on the loop of its first request, which is ours.
        self._engine = await asyncio.to_thread(_build_engine, self.spec)
        await _shorten_worker_spin(self._engine, self.spec.cpu_worker_spin_ms)
        self.dtype = str(self._engine.model_config.dtype).removeprefix("torch.")

    async def stream(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: dict[str, Any],
        priority: int = 0,
        images: Sequence[bytes] = (),
    ) -> AsyncGenerator[Delta, None]:
        """Stream one request. Cancelling the consuming task aborts the request inside the engine.
        The prompt's tokens are the count vLLM reports (a vision model's images expand into many)."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        await self.wait_ready()
        try:
            params = sampling_params(sampling)
        except (TypeError, ValueError, VLLMClientError) as exc:  # vLLM's validation raises the last
            raise EngineRequestError(f"invalid sampling parameters: {exc}") from None
        kwargs: dict[str, Any] = {"priority": priority} if self.spec.uses_priority else {}
        top_logprobs = sampling.get("logprobs")
        completion_tokens = 0
        prompt_tokens = len(prompt_token_ids)
        prompt = TokensPrompt(**engine_prompt(prompt_token_ids=prompt_token_ids, images=images))  # type: ignore[typeddict-item]
        try:
            async for output in self._engine.generate(prompt, params, request_id, **kwargs):
                prompt_tokens = len(output.prompt_token_ids or ()) or prompt_tokens
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

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        super().shutdown()


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
    engine_environment_set()
    with ML_IMPORTS:
        from vllm import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

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


_hosts: dict[str, EngineHostBase] = {}

# The hosts a deployment's `engine` names (ModelDeployment.Engine).
HOSTS: dict[str, type[EngineHostBase]] = {EngineHost.kind: EngineHost, ScriptedEngineHost.kind: ScriptedEngineHost}


def engine_host_for(spec: EngineSpec) -> EngineHostBase:
    """The process's host for a deployment, created on first use (not started): vLLM's, or the
    scripted engine's where the spec says so. The one place a host is chosen, for the web process
    and the Celery worker alike."""
    host = _hosts.get(spec.host_name)
    if host is None:
        host = _hosts[spec.host_name] = HOSTS[spec.engine](spec)
    return host


def engine_hosts() -> dict[str, EngineHostBase]:
    """This process's hosts by `EngineSpec.host_name`: a deployment's name, or it marked ':scripted'."""
    return dict(_hosts)
