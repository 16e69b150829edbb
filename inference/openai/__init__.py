"""The OpenAI-compatible API (`apis`: /v1/models, /v1/chat/completions), its service (`services`: a
completion checked and queued), and its wire format (`wire`)."""
