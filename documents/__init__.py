"""Documents: files people upload, their chunks and index, and retrieval with citations."""
