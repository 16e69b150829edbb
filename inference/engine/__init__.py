"""The engine: one vLLM AsyncLLM per deployment in this process (`host`), the fenced reaches into
vLLM's internals (`vllm_internals`), tokenizers, and the offline preparation of the default model."""
