"""This project's job handlers. Add modules here and list them under `jobs:` in config/dygo.yml."""

from jobs import examples as examples  # noqa: F401  (registers the example kinds)
