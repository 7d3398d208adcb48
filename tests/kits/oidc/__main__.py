"""`python -m tests.kits.oidc`: install the tests' OpenID Connect provider (if it is not there
yet) and print where it is."""

from tests.kits.oidc import install

print(install())
