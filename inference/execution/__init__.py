"""Where and how a generation runs: dispatch to the backend chosen at start-up (in this process, or
a Celery GPU worker), the runner that drives one generation through its engine, the GPU workers and
their task, and the web server's lifespan."""
