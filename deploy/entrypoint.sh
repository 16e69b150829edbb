#!/bin/sh
# The image's entry point: one image, a role per process. The web process, the GPU worker and the
# documents worker run the Procfile's own lines, so the image and `make topology` start them alike.
#   web | worker | documents   the Procfile's process of that name
#   migrate                    apply migrations (the one-shot step the others wait for)
#   wait-for-migrations        wait until every migration is applied (Kubernetes init containers)
#   prepare-model              convert the default model into INFERENCE_MODELS_DIR (done at build)
#   health [URL]               exit 0 when URL (default: this web process's /healthz) answers 200
#   anything else              run as a command (`manage.py createsuperuser`, `bash`)
set -eu
cd "${CHATSITE_APP_DIR:-/app}"  # the image's; tests run the script on a stand-in
role="${1:-web}"
case "$role" in
    web | worker | documents)
        shift
        if [ "$role" = web ] && [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
            # A restarted container's figures would otherwise be added to its new process's.
            mkdir -p "$PROMETHEUS_MULTIPROC_DIR" && rm -f "$PROMETHEUS_MULTIPROC_DIR"/*.db
        fi
        line="$(sed -n "s/^$role: //p" Procfile)"
        [ -n "$line" ] || { echo "no '$role' process in the Procfile" >&2; exit 2; }
        # The line's ${VAR:-default}s expand here; exec replaces this shell, so SIGTERM reaches
        # uvicorn's or Celery's own graceful shutdown.
        eval "exec $line \"\$@\""
        ;;
    migrate)
        exec .venv/bin/python manage.py migrate --noinput
        ;;
    wait-for-migrations)
        until .venv/bin/python manage.py migrate --check >/dev/null 2>&1; do
            echo "waiting for migrations to be applied"
            sleep 5
        done
        ;;
    prepare-model)
        exec .venv/bin/python manage.py prepare_model
        ;;
    health)
        url="${2:-http://127.0.0.1:${PORT:-8000}/healthz}"
        exec .venv/bin/python -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url"
        ;;
    *)
        exec "$@"
        ;;
esac
