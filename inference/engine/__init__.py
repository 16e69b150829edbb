"""The engine: one vLLM AsyncLLM per deployment in this process (`host`), the fenced reaches into
vLLM's internals (`vllm_internals` for its engine, `vllm_server_internals` for its OpenAI server's
tool parsers and structured-output checks), tokenizers, and the offline preparation of the default model."""
