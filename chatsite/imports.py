"""One lock for importing the machine-learning stack from background threads.

transformers' lazily built package is not safe to import from two threads at once: vLLM's engine
build in one thread and the moderation embedder's load in another failed with "cannot import name
'PreTrainedConfig' from 'transformers'", and the engine never came up. Code that may be the first
in its process to import transformers (directly, or through vLLM or sentence-transformers) does it
while holding this lock; once imported, the modules are safe to use from any thread.
"""

from __future__ import annotations

import threading

ML_IMPORTS = threading.RLock()
