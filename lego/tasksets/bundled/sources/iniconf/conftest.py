# Lets the tests import the package from the repository root without installing it.
