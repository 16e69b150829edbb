"""The OpenAI-compatible API (`apis`: /v1/models, /v1/chat/completions) and its wire format (`wire`),
which the chat socket's events share."""
