from tests.accounts.conftest import put_on_tier  # noqa: F401  (the same fixture as the accounts tests')
