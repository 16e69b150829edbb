"""A real OpenID Connect provider for the tests: django-oauth-toolkit with OIDC on, run in a process
of its own on loopback (`serve.py`), with its own small settings and the people a test writes into
a JSON file (`people.py`). It also answers GitHub's two API calls for the GitHub preset's tests."""
